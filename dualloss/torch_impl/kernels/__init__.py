"""The place for the torch backend's accelerator kernels (DESIGN section 11; none yet).

What goes here: one module per loss family (``softmax``, ``sigmoid``, ``linear``, the names of
the eager modules next to this package) holding its Triton kernels, the custom op
(``torch.library.triton_op`` or ``custom_op``) with its fake (shape-only) implementation, and
the thin launcher that picks block sizes from the shapes (``tl.constexpr`` derived from C, never
scattered literals). The autograd glue stays where the eager path's is (``_autodiff`` and the
family module), which picks the kernel or the eager code; this package never imports them.

The rules each kernel keeps:

* The spec's closed forms, in the spec's symbols: a kernel's docstring names the
  ``dualloss.spec`` function it mirrors. One program per row (softmax) or per block of elements
  (sigmoid); the forward computes the loss and, when a gradient is needed, the gradient in the
  same pass into its own buffer; backward scales it.
* The strict standard of the eager path: libdevice's exact ``exp``/``log`` where the fast
  approximate ones would cost digits.
* Custom ops, so ``torch.compile`` (fullgraph), autocast and ``torch.func`` see no graph break.
* Selection ``auto`` / ``triton`` / ``eager`` via ``DUALLOSS_TORCH_KERNELS`` or
  ``torch_impl.kernels(...)``; on a CPU tensor ``triton`` runs under ``TRITON_INTERPRET=1``, and
  that is how CPU machines test the kernels, against the spec.
* No loss ever writes into a caller's tensor; memory is saved by recomputing, never by reusing
  inputs.
* Per forward + backward: no more dispatched torch ops than the peer, 1-3 kernel launches, no
  host synchronisation.

May import ``dualloss._checks``, torch and triton; never the family modules or ``dropins``.
"""
