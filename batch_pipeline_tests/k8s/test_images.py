"""Static checks of the Dockerfiles (building them needs a Docker daemon, which tests do not have)."""

import json
import re

from batch_pipeline_tests.k8s.support import K8S_DIR, by_kind, load_docs


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (K8S_DIR / name).read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def values_of(steps: list[tuple[str, str]], word: str) -> list[str]:
    return [rest for w, rest in steps if w == word]


def final_user_is_not_root(steps) -> bool:
    users = values_of(steps, "USER")
    return bool(users) and users[-1].split(":")[0] not in ("root", "0")


def test_user_code_image():
    steps = instructions("Dockerfile")
    assert values_of(steps, "FROM") == ["python:3.11-slim"]
    assert any(re.search(r"pip install \.(\s|$)", run) for run in values_of(steps, "RUN"))
    assert final_user_is_not_root(steps)


def test_gpu_image_is_our_package_on_a_pinned_vllm_base():
    steps = instructions("Dockerfile.gpu")
    [base] = values_of(steps, "FROM")
    image, _, tag = base.partition(":")
    assert image == "vllm/vllm-openai" and re.fullmatch(r"v\d+\.\d+\.\d+", tag), base
    # the same vLLM as the server Deployment
    [server] = by_kind(load_docs(K8S_DIR / "vllm-server.yaml"), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert server["image"] == base
    assert any('".[vllm]"' in run or " .[vllm]" in run for run in values_of(steps, "RUN"))
    assert final_user_is_not_root(steps)
    # step pods get `dagster api execute_step ...` as args: the base image's server entrypoint must go
    assert json.loads(values_of(steps, "ENTRYPOINT")[-1]) == []


def test_the_checks_can_fail():
    assert not final_user_is_not_root([("USER", "10001"), ("USER", "root")])
    assert not final_user_is_not_root([("RUN", "true")])
