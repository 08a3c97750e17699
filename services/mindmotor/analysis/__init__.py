"""Operators' analyses of a running platform, read from what it exports (`mindmotor analyze`)."""
