"""Benchmark registry: loaders and prompt formats."""
from .registry import TASKS, load_task, read_task_table, write_task_table

__all__ = ["TASKS", "load_task", "read_task_table", "write_task_table"]
