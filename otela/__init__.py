"""otela: a decentralized overlay for federated LLM serving."""

__version__ = "0.1.0"
