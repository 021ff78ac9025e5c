"""The dynamic job scheme and ``ensio cycle`` (DESIGN.md: workflow → config, durable).

One exception to the import rule: :mod:`.transferred` imports the ``transfer`` room
(its config, ``run.prepare``, the daemon's protocol) for ``workflow.transfer``, and
only inside its functions, so a run without transfer never loads it. The two rooms
sit side by side under ``cli``; ``transfer`` imports nothing of ``workflow``, so no
cycle can form, and re-implementing how a program is put under the interposer here
would let the two drift apart.
"""
