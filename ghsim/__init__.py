"""ghsim: predict one LLM training step on Grace Hopper and PCIe Hopper GPUs."""

__version__ = "0.1.0"
