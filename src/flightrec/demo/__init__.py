"""The demo: the whole system on one machine (:mod:`.system`) with a simulated fleet (:mod:`.fleet`).

Kept apart from the ground floor (errors, settings, readers) in ``flightrec``: nothing
outside the demo imports it. What the demo runs ships inside it (``entrypoint.sh``, the
example instance entrypoint), so an installed wheel runs the demo without a checkout.
"""
