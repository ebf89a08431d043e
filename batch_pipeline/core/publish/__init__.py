"""The staged and validated tables, dead letters, the report and its plots."""
