"""The transaction: plan, apply, verify by read-back and roll back.

engine.py runs a request's keys through the knob families; journal.py keeps
what an apply changed (on disk, before it changes it), so that a rollback or
a later `nictune rollback` can put it back; aside.py records the kernel side
effects a change takes with it; watchdog.py undoes a remote apply that its
controller does not confirm.
"""
