"""The shared benchmark workloads (decode-heavy, mixed, their Poisson-arrival variants).

They live in the package (`edge_infer.workloads`) so that `edge-infer bench --workload` can use
them too; this module is the benchmarks' name for them."""

from edge_infer.workloads import WORKLOADS, BenchRequest, make_workload

__all__ = ["WORKLOADS", "BenchRequest", "make_workload"]
