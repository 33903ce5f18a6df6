"""Simulation for demos and tests: simulated GPUs, a simulated vLLM-like server and its rendezvous, the
llama-cpp-python server wrapper and the tiny test model's locator. A GPU node never needs any of it."""
