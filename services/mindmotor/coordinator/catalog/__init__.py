"""The models this front door serves: their tokenizers and chat templates, from a local
checkpoint directory or discovered from their workers."""
