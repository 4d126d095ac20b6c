"""kernel_gym: learn Triton kernel launch configs for MoE LLM serving from real compile-and-measure data."""

__version__ = "0.1.0"


def _register_envs() -> None:
    """Register the Gymnasium ids when gymnasium is installed (it is not on the GPU machine)."""
    try:
        import gymnasium  # noqa: F401
    except ImportError:
        return
    try:
        from kernel_gym.envs import register_envs
    except ImportError:
        return
    register_envs()


_register_envs()
