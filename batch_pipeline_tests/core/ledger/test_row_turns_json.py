"""``RequestPlan.row_turns_json`` escapes with ``json.encoder.encode_basestring`` (no encoder built per request): the
bytes must stay those of ``json.dumps(..., ensure_ascii=False)``, which every uploaded request line was made of."""

import json

from batch_pipeline.core.ledger.executor import RequestPlan
from batch_pipeline.core.spec.job import OutputSpec

TRICKY = [
    "",
    "plain ascii",
    'quotes " and \\ backslashes / slash',
    "controls \x00\x01\x08\x0b\x0c\x1f\x7f tab\t nl\n cr\r",
    "line sep \u2028 para \u2029 nbsp \xa0 bom \ufeff",
    "accents éàü, CJK 漢字, emoji 😀👍🏽, RTL שלום",
    "Text:\n" + "ünïcödé " * 500,
]


def test_row_turns_json_is_json_dumps_byte_for_byte():
    plan = RequestPlan(model="m", system="s", sampling=None, output=OutputSpec(choice=["a", "b"]))
    for text in TRICKY:
        expected = '{"role":"user","content":' + json.dumps(text, ensure_ascii=False) + "}"
        assert plan.row_turns_json(text) == expected
        assert json.loads("[" + plan.row_turns_json(text) + "]") == plan.row_turns(text)
