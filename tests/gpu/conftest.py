"""Skip every GPU test cleanly where PyCUDA or a CUDA device is missing (CI has neither)."""

import pytest


def _gpu_reason() -> str | None:
    try:
        import pycuda.driver as drv
    except Exception as e:  # not installed, or libcuda missing
        return f"PyCUDA unavailable ({type(e).__name__}: {e})"
    try:
        drv.init()
        if drv.Device.count() == 0:
            return "no CUDA device"
    except Exception as e:
        return f"no CUDA device ({e})"
    return None


_REASON = _gpu_reason()


def pytest_collection_modifyitems(config, items):
    if _REASON is None:
        return
    skip = pytest.mark.skip(reason=_REASON)
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cuda_ctx():
    import pycuda.autoinit  # noqa: F401  (creates the context once)

    return True
