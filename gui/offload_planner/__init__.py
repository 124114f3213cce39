"""Offload Planner: plan llama.cpp tensor placement across CPU RAM and GPUs."""

__version__ = "0.1.0"
