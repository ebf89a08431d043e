"""Quotes written before the quote was a typed record (a dict without ``version``) still read, as version 1."""

import json

from batch_pipeline.core.money.quote_record import QUOTE_VERSION, Quote, read_quote
from batch_pipeline.core.store import Store

# a quote of a job with a fallback, exactly as ``make_quote`` wrote it before the record was typed
BEFORE = r"""
{
  "job": "fb",
  "model": "gpt-4o-mini",
  "backend": "openai_batch",
  "pending_requests": 40,
  "probe_requests": 0,
  "price": {
    "input_per_mtok": 0.15,
    "cached_input_per_mtok": 0.075,
    "output_per_mtok": 0.6,
    "batch_discount": 0.5,
    "cache_ttl": null,
    "cache_write_multiplier": 1.25,
    "checked": "2026-11-30"
  },
  "calibration": {
    "factor": 1.0,
    "items_measured": 0,
    "tokenizer_factor": 1.0
  },
  "tokenizer": {
    "tokenizer": "o200k_base",
    "exact": true,
    "per_estimated": 0.9100120627261761,
    "fixed_estimated": 152,
    "fixed_tokens": 175,
    "system_tokens": 114,
    "schema_tokens": 50,
    "sampled": 40
  },
  "cache_hit_share": {
    "low": 0.0,
    "expected": 0.2116598588934274,
    "high": 0.4233197177868548
  },
  "cache_write_share": {
    "low": 0.0,
    "expected": 0.0,
    "high": 0.0
  },
  "cache": {
    "prefix_tokens": 114,
    "writes_billed": false,
    "ttl": null,
    "write_multiplier": 1.25,
    "first_write_batches": 0
  },
  "passes": {
    "first": {
      "requests": 40,
      "input_tokens": 10772,
      "output_tokens_expected": 640,
      "output_tokens_max": 640,
      "cost_low": 0.0008288999999999999,
      "cost_expected": 0.0009144,
      "cost_high": 0.001201875
    },
    "probes": {
      "requests": 0,
      "input_tokens": 0,
      "output_tokens_expected": 0,
      "output_tokens_max": 0,
      "cost_low": 0.0,
      "cost_expected": 0.0,
      "cost_high": 0.0,
      "shards": 0
    },
    "retries": {
      "expected_share": 0.02,
      "cost_expected": 1.8288000000000002e-05,
      "cost_high": 0.00012018750000000001
    },
    "fallback": {
      "model": "gpt-4o",
      "backend": "openai_batch",
      "share": 0.02,
      "measured_on": 0,
      "requests_expected": 0.8,
      "input_tokens_per_request": 269.3,
      "cost_low": 0.0002763,
      "cost_expected": 0.0003048,
      "cost_high": 0.000400625
    }
  },
  "cascade": null,
  "est_cost_usd": {
    "low": 0.0011052,
    "expected": 0.00123749,
    "high": 0.00172268
  },
  "spent_usd": 0.0,
  "budget_usd": 5.0,
  "within_budget": true,
  "components": {
    "input files": "e0c66c5d51937ad7f78dc33ba6a72bebd870d00bcbc8e6547379f79b1fa107b0",
    "job spec": "a89413d00a3a122f8ab2894749e3a4a4dee8bc6a8a4f823c55d7808d2205ce83",
    "prompt version": "v1",
    "model": "gpt-4o-mini",
    "prices": "895b9fe811202fe7eb7646f0ce3748d6d7bb1e311fb217b96a030eb3bac8085c",
    "manifest generation": "1"
  },
  "fingerprint": "1407ece31dc4fae435a7902e495b41e4ca03cfa8c5fdaa95e9e565b6718d3dbc",
  "created_at": "2026-12-02T04:38:26.754338+00:00",
  "expires_at": "2026-12-02T05:08:26.754338+00:00"
}
"""


def test_a_quote_written_before_versions_reads_as_version_1_and_writes_back_the_same(tmp_path):
    store = Store(tmp_path)
    store.write_json("jobs/fb/quote.json", json.loads(BEFORE))
    quote = read_quote(store, "fb")
    assert quote is not None and quote.version == 1 == QUOTE_VERSION
    assert quote.est_cost_usd.high == 0.00172268 and quote.passes.fallback is not None
    assert quote.passes.fallback.requests_expected == 0.8 and quote.tokenizer.tokenizer == "o200k_base"
    assert quote.price.checked.isoformat() == "2026-11-30" and quote.cascade is None and quote.route is None
    # what the quote asset and the CLI show is the stored JSON: unchanged but for the version
    assert quote.as_json() == {**json.loads(BEFORE), "version": 1}


def test_a_plain_quote_keeps_no_fallback_or_route_keys_and_ignores_unknown_ones():
    plain = json.loads(BEFORE)
    del plain["passes"]["fallback"]
    quote = Quote.model_validate({**plain, "a_newer_field": 1})
    assert "fallback" not in quote.as_json()["passes"] and "route" not in quote.as_json()
    assert "a_newer_field" not in quote.as_json()


def test_a_quote_that_does_not_read_is_no_quote(tmp_path):
    store = Store(tmp_path)
    store.write_json("jobs/fb/quote.json", {"job": "fb", "expires_at": "2026-12-02T05:08:26+00:00"})
    assert read_quote(store, "fb") is None  # the driver re-quotes, a submission refuses
