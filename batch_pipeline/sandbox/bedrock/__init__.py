"""Amazon Bedrock batch inference: the control plane (rest-json) over the sandbox's S3."""
