"""Deterministic synthetic JSONL input rows for the benchmarks: ``{"id": ..., "body": ...}``.

Bodies are 300-1,500 characters (``--short``: 200-420) of word-like text (a few accented words, so the files are real
UTF-8). Every body is made distinct by a ``ref <n>`` word, and 5% of rows are whitespace variants of an
earlier row (tabs, ``\\xa0``, ``\\u2028``, double spaces, leading/trailing newlines): after
normalisation they equal their original, so ``unique = rows - duplicates`` exactly.

Files are cached by (rows, seed, start) under ``benchmarks/out/`` (gitignored) with a sidecar ``.json``
holding the counts; a rerun returns the cached path at once. ``start`` numbers the rows from there (ids and
``ref`` words), so a file with ``start=N`` adds rows that no file of N rows holds (an incremental benchmark's
new daily file). Benchmarks call ``rows_file``, which generates in a separate process: the generator's
multi-GB peak then never shows in the measured process's memory figures.

    python benchmarks/make_rows.py --rows 1000000 [--seed 7] [--start 0] [--out PATH]
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

OUT_DIR = Path(__file__).resolve().parent / "out"
DUP_SHARE = 0.05
MIN_BODY, MAX_BODY = 300, 1500
SHORT_BODY = (200, 420)  # ~300 characters: 100M rows in ~35 GB
GEN_CHUNK = 1_000_000
POOL_CHARS = 8 * 2**20

_SYLLABLES = (
    "ka",
    "ro",
    "mi",
    "ten",
    "sa",
    "lu",
    "dor",
    "ve",
    "qui",
    "an",
    "pel",
    "is",
    "ok",
    "ba",
    "ne",
    "tri",
    "gor",
    "fa",
    "zen",
    "ur",
    "mo",
    "chi",
    "el",
    "wa",
    "pro",
    "st",
    "ex",
    "ly",
    "ing",
    "ed",
)
_EXTRA_WORDS = (
    "café",
    "naïve",
    "façade",
    "über",
    "déjà",
    "señor",
    "Zürich",
    "crème",
    "coöperate",
    "résumé",
    "refund",
    "invoice",
    "password",
    "login",
    "crash",
    "error",
    "feature",
    "export",
    "billing",
)
_PUNCT = ("", "", "", "", "", "", ",", ".", "?", "!", ":")


def cache_path(rows: int, seed: int, start: int = 0, short: bool = False, zstd: bool = False) -> Path:
    """``zstd``: the same rows compressed whole (``.jsonl.zst``), for inputs larger than the disk holds plain."""
    tag = (f"-from{start}" if start else "") + ("-short" if short else "")
    return OUT_DIR / f"rows-{rows}-seed{seed}{tag}.jsonl{'.zst' if zstd else ''}"


def _pool(rng: random.Random) -> str:
    """A long string of words separated by single ASCII spaces; bodies are slices of it."""
    vocab = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(6000)]
    vocab += list(_EXTRA_WORDS) * 20
    words = []
    size = 0
    while size < POOL_CHARS:
        w = rng.choice(vocab)
        if rng.random() < 0.08:
            w = w.capitalize()
        w += rng.choice(_PUNCT)
        words.append(w)
        size += len(w) + 1
    return " ".join(words)


def _variant(body: str, kind: int, rng: random.Random) -> str:
    """A whitespace variant of ``body`` that normalises back to ``body``."""
    if kind == 0:  # some spaces become tabs
        return body.replace(" ", "\t", rng.randint(1, 20))
    if kind == 1:  # non-breaking spaces
        return body.replace(" ", "\xa0", rng.randint(1, 20))
    if kind == 2:  # a line separator inside, a paragraph separator at the end
        return body.replace(" ", "\u2028", rng.randint(1, 3)) + "\u2029"
    if kind == 3:  # double spaces
        return body.replace(" ", "  ", rng.randint(1, 8))
    if kind == 4:  # trailing newlines
        return body + "\n\n"
    return "\n \t" + body.replace(" ", " \r\n ", 2) + " \n"  # leading junk, CRLF runs, trailing


def generate(rows: int, seed: int, path: Path, start: int = 0, short: bool = False, zstd: bool = False) -> dict:
    """Rows in chunks of 1M (the random draws per chunk, originals kept as pool offsets, not strings), so that
    100M rows are made in bounded memory."""
    started = time.perf_counter()
    rng = random.Random(seed + start)
    pool = _pool(rng)
    npr = np.random.default_rng(seed + start)
    lo, hi = SHORT_BODY if short else (MIN_BODY, MAX_BODY)
    # originals as (pool start, pool end, row number): 16 bytes each, for duplicates to refer to
    orig_s = np.empty(rows, dtype=np.int32)
    orig_e = np.empty(rows, dtype=np.int32)
    orig_i = np.empty(rows, dtype=np.int64)
    originals = 0
    duplicates = 0
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    find, rfind = pool.find, pool.rfind
    dumps = json.dumps
    with _text_out(tmp, zstd) as out:
        for chunk in range(0, rows, GEN_CHUNK):
            n = min(GEN_CHUNK, rows - chunk)
            lengths = npr.integers(lo + 12, hi - 24, size=n).tolist()  # room for the cut and " ref <n>"
            starts = npr.integers(0, len(pool) - hi - 64, size=n).tolist()
            dup_mask = (npr.random(n) < DUP_SHARE).tolist()
            if chunk == 0:
                dup_mask[0] = False
            dup_kind = npr.integers(0, 6, size=n).tolist()
            dup_of_frac = npr.random(n).tolist()
            buf: list[str] = []
            for j in range(n):
                i = chunk + j
                if dup_mask[j]:
                    k = int(dup_of_frac[j] * originals)
                    src = f"{pool[orig_s[k] : orig_e[k]]} ref {orig_i[k]}"
                    body = _variant(src, dup_kind[j], rng)
                    duplicates += 1
                    buf.append(f'{{"id":"r{start + i:09d}","body":{dumps(body, ensure_ascii=False)}}}\n')
                else:
                    s = find(" ", starts[j]) + 1
                    e = rfind(" ", s, s + lengths[j])
                    orig_s[originals], orig_e[originals], orig_i[originals] = s, e, start + i
                    originals += 1
                    # the pool holds no quotes, backslashes or control characters: no escaping needed
                    buf.append(f'{{"id":"r{start + i:09d}","body":"{pool[s:e]} ref {start + i}"}}\n')
                if len(buf) >= 20000:
                    out.write("".join(buf))
                    buf.clear()
            out.write("".join(buf))
    os.replace(tmp, path)
    meta = {
        "rows": rows,
        "seed": seed,
        "start": start,
        "short": short,
        "zstd": zstd,
        "duplicates": duplicates,
        "unique": rows - duplicates,
        "bytes": path.stat().st_size,
        "seconds": round(time.perf_counter() - started, 2),
    }
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    return meta


def _text_out(path: Path, zstd: bool):
    """A text file to write rows to; zstd level 1 (the generator, not the codec, sets the pace)."""
    if not zstd:
        return open(path, "w", encoding="utf-8", newline="\n")
    import io

    import pyarrow as pa

    raw = pa.CompressedOutputStream(str(path), "zstd")  # Arrow's default zstd level is 1
    return io.TextIOWrapper(io.BufferedWriter(raw, 8 * 2**20), encoding="utf-8", newline="\n")


def ensure_rows(
    rows: int, seed: int = 7, path: Path | None = None, start: int = 0, short: bool = False, zstd: bool = False
) -> tuple[Path, dict]:
    """The cached file for (rows, seed, start, short, zstd), generating it first (in this process) if needed; plus
    its counts."""
    cached = cache_path(rows, seed, start, short, zstd)
    meta_path = cached.with_suffix(".json")
    if not (cached.exists() and meta_path.exists()):
        generate(rows, seed, cached, start, short, zstd)
    meta = json.loads(meta_path.read_text())
    if path is not None and Path(path) != cached:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if Path(path).exists():
            Path(path).unlink()
        try:
            os.link(cached, path)
        except OSError:
            import shutil

            shutil.copyfile(cached, path)
        return Path(path), meta
    return cached, meta


def rows_file(rows: int, seed: int = 7, start: int = 0, short: bool = False, zstd: bool = False) -> tuple[Path, dict]:
    """The cached file for (rows, seed, start, short, zstd), generated by a separate ``python make_rows.py`` process
    on a miss, so that the caller's peak RSS stays its own."""
    cached = cache_path(rows, seed, start, short, zstd)
    meta_path = cached.with_suffix(".json")
    if not (cached.exists() and meta_path.exists()):
        subprocess.run(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--rows",
                str(rows),
                "--seed",
                str(seed),
                "--start",
                str(start),
                *(["--short"] if short else []),
                *(["--zstd"] if zstd else []),
            ],
            check=True,
        )
    return cached, json.loads(meta_path.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--start", type=int, default=0, help="number the rows from here (a later file of a job)")
    ap.add_argument("--short", action="store_true", help="~300-character bodies (200-420) instead of 300-1,500")
    ap.add_argument("--zstd", action="store_true", help="write .jsonl.zst (zstd 1), e.g. 100M rows on a small disk")
    ap.add_argument("--out", type=Path, default=None, help="also place the file here (hard link or copy)")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    path, meta = ensure_rows(args.rows, args.seed, args.out, args.start, args.short, args.zstd)
    print(
        f"{path}: {meta['rows']:,} rows, {meta['duplicates']:,} whitespace duplicates, "
        f"{meta['bytes'] / 2**20:,.0f} MiB ({time.perf_counter() - t:.1f}s, generated in {meta['seconds']}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
