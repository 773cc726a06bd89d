"""agents-stream: LLM agent work as a stateful Faust stream topology on Kafka."""

__version__ = "0.1.0"
