"""Amazon Bedrock batch inference (boto3 ``bedrock`` + ``s3``)."""
