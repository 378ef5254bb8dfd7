"""The runner: executes one offloaded cell (or a warm session of them) and answers in framed events.

It travels as a self-contained zipapp (see :mod:`.build`) to wherever the cell runs, so everything here
imports only the standard library, its own modules (relatively) and the two libraries it carries,
cloudpickle and pynvml. The contract with the engine is docs/runner-protocol.md.
"""
