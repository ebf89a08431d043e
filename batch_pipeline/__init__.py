"""batch_pipeline: offline batch LLM inference on Dagster."""
