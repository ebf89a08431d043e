"""A Bedrock job's answers so far, spooled (``sandbox/spooled_parts.py``): each is its output line (``modelOutput``
or ``error``) in the part of its input file (``<job>.out<i>.part``, ``i`` the file's place in the job's input) the
moment it is produced; when the job ends each part is written to S3 as ``<input file>.out``."""

from __future__ import annotations

from batch_pipeline.sandbox.bedrock.records import RecordResult
from batch_pipeline.sandbox.spooled_parts import SpooledParts, encode


def part_name(file_index: int) -> str:
    """The part of the job's ``file_index``-th input file."""
    return f"out{file_index}"


class BedrockAnswers(SpooledParts):
    """The output lines of a job so far, by input file, and the succeeded records' count and tokens."""

    TOTAL_KEYS = ("succeeded", "input_tokens", "output_tokens")

    def append_to(self, file_index: int, answer: RecordResult) -> None:
        """Encode one answer as its output line in its input file's part (and its billing, if it succeeded)."""
        self.add(part_name(file_index), encode(answer.output))
        if answer.succeeded:
            self.add_billing(str(answer.output["recordId"]), answer)
            for key, value in zip(self.TOTAL_KEYS, (1, answer.input_tokens, answer.output_tokens), strict=True):
                self.totals[key] += value
        self.count += 1
