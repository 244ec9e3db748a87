"""dualloss: cross-entropy and focal losses for PyTorch and JAX, checked against a NumPy spec.

Importing ``dualloss`` imports neither torch nor jax: pick a backend explicitly,
``dualloss.torch_impl`` or ``dualloss.jax_impl``. ``dualloss.spec`` is the float64 reference.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
