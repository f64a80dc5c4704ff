"""Scale-out on Ray Serve (the `[cluster]` extra): `edge-infer serve --replicas N`.

Two tiers: the ingress deployment runs the plain server's FastAPI app (the same parsing,
limits, errors and streaming) with a ClusterEngine in place of the local engine thread: it
tokenizes and templates locally and sends typed EngineRequests to the engine deployment, whose
replicas each hold one engine. The engine deployment's handle routes with
PrefixAffinityRouter: a request whose prompt shares a long prefix with an earlier one goes to
the replica that served it (its prefix cache holds those blocks), else to the least loaded.

Modules: request (EngineRequest, what crosses between the tiers), delta (streamed outputs as
deltas), replica (the engine deployment), client (ClusterEngine and its RemoteWorker, the
ingress's side), router (PrefixAffinityRouter), app (building and running the application). Nothing here is imported
unless Ray flags are given.
"""
