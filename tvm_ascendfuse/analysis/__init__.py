"""Analyses of compiled modules: kernels launched, traffic, on-chip buffer use."""

from .kernels import (groups_before_fuse_tir, kernel_table, launch_count, launched_kernels, relax_op_count,
                      symbolic_sizes)
from .traffic import count_primfunc, lower_bound, traffic_summary

__all__ = ["groups_before_fuse_tir", "kernel_table", "launch_count", "launched_kernels", "relax_op_count",
           "symbolic_sizes", "count_primfunc", "lower_bound", "traffic_summary"]
