# pytest-jupyter's fixtures (jp_serverapp, jp_fetch, ...) for the integration tier. pytest
# only honours pytest_plugins in the top-level conftest.
pytest_plugins = ["pytest_jupyter.jupyter_server"]
