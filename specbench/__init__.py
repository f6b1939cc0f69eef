"""specbench: speculative decoding in vLLM, measured properly."""
