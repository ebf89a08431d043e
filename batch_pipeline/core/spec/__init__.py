"""The job spec and where every record lives (JobPaths)."""
