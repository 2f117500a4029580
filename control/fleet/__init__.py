"""Scale-out on Ray Serve: N engine replicas behind one control plane.

``servedeck serve --replicas N`` keeps this process as the control plane (the policy store,
schedules, guardrail, /v1 and /admin) and runs the engines as a Ray Serve deployment:
``replica.py`` (one ``AsyncEngine`` per replica), ``router.py`` (the request router: free KV
above the reserve, queue, cached prefix; power-of-two choices as the fallback), ``score.py``
(the router's score, free of Ray), ``client.py`` (the deployment handle as the routes' engine),
``runtime.py`` (the fleet runtime: fan-out of policy versions, reconcile, per-replica sweeps).

Only this package imports ray, and only its Ray modules at call time: without the
``distributed`` extra every other command works and ``--replicas`` says what to install.
"""
