"""Models the GPU end-to-end tests (tests/test_e2e_gpu.py) serve. Import its modules only where torch is."""
