"""``dg scaffold defs batch_pipeline.BatchInferenceJob NAME``: a ``<defs folder>/NAME/defs.yaml`` whose attributes are
a job spec that runs as it is on the bundled provider sandbox (no key, no cost): the small ticket sample labelled
through the OpenAI Batch API path. Edit its input, prompt, model and backend to make it yours."""

import re

import dagster as dg

from batch_pipeline.core.spec.job import JOB_NAME_PATTERN

STARTER = """\
# A batch inference job: the attributes are its job spec (the keys of data/jobs/*.yaml; relative paths are read
# from the project root). As scaffolded it labels the small ticket sample on the bundled provider sandbox (no
# key, no cost): `batch-pipeline run {name}`, or materialize {name}/manifest .. {name}/report in `dg dev`.
type: {type_name}
attributes:
  name: {name}
  description: Triage support tickets into a fixed set of categories (scaffolded; edit to make it yours).
  input:
    path: data/samples/tickets_small/*.jsonl
    text_field: body
    key_field: ticket_id
    max_input_tokens: 4000
  prompt:
    version: v1
    system: |
      You triage customer support tickets. Answer with exactly one label from the allowed set:
      billing, bug, feature_request, account, other.
    template: "Subject: {{subject}}\\nTicket:\\n{{body}}"
  model: gpt-4o-mini
  backend:
    name: openai_batch
    settings: {{sandbox: true}}
  sampling: {{temperature: 0, max_tokens: 16}}
  output:
    choice: [billing, bug, feature_request, account, other]
  shards: {{max_requests: 20}}
  retries: {{per_item: 3}}
  budget_usd: 1
"""


class BatchInferenceJobScaffolder(dg.Scaffolder):
    """Writes ``defs.yaml`` for the job named after its folder (a job name: lower case, digits and ``_``)."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        name = request.target_path.name
        if not re.match(JOB_NAME_PATTERN, name):
            raise ValueError(
                f"{name!r} is not a job name: start with a lower-case letter, then lower-case letters, digits or _ "
                "(at most 48 characters)"
            )
        request.target_path.mkdir(parents=True, exist_ok=True)
        text = STARTER.format(name=name, type_name=request.type_name)
        (request.target_path / "defs.yaml").write_text(text, encoding="utf-8")
