"""Reference numerics the numpy-computing backends share (the CPU, the simulated NPU, and
OpenCL's host-side geometry): sliding-window geometry of Conv and pooling, the error function.
Part of the contract a backend may import, so no backend imports another for them."""
