"""The job spec, the settings read once, and where every record lives (JobPaths)."""
