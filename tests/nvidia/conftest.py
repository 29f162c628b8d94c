"""The NVIDIA tests' fixtures (``fake_nvml_lib``, ``fake_node``, ``watching``) live in
tests/fakenvml/fixtures.py and are loaded for every directory by tests/conftest.py:
the fake NVML can be loaded only once per process, so it is one session fixture."""
