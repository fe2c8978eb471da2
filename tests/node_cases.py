"""The onnx node conformance cases for kernel tests: ``anychip.conformance.cases``, which the
installed conformance kit uses too."""

from anychip.conformance.cases import (
    NodeCase,
    assert_outputs_close,
    load_case,
    node_cases,
    run_case,
)

__all__ = ["NodeCase", "assert_outputs_close", "load_case", "node_cases", "run_case"]
