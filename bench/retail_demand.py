"""Issue 3 point 5 figures: which brokers hold demand, N stores under one region."""
import json, sys, time
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.testing import Estate

def build(n, mode, ttl=None):
    e = Estate(log_advisories=True)
    stores = [f"S{i}" for i in range(1, n + 1)]
    if mode == "tree":
        e.add("HQ"); e.add("R", tree=TreeSettings("branch"))
        for s in stores: e.add(s, tree=TreeSettings("leaf"))
        assert e.tree_link("R", "HQ")
        for s in stores: assert e.tree_link(s, "R")
    else:
        for b in ["HQ", "R", *stores]: e.add(b)
        st = LinkSettings(duplex=True, network_ttl=ttl)
        e.link("R", "HQ", st)
        for s in stores: e.link(s, "R", st)
    e.run_until_quiet()
    return e

def holders(e, consumer):
    return {ev["broker"] for ev in e.events("demand.created", consumer=consumer)}

def summarize(h, n):
    stores = sum(1 for b in h if b.startswith("S"))
    return {"region": "R" in h, "hq": "HQ" in h, "stores": stores}

for n in (5, 1000):
    for mode, ttl in (("mesh", 1), ("mesh", 2), ("mesh", 3), ("tree", None)):
        t = time.time()
        e = build(n, mode, ttl)
        e.subscribe("S1", "in", "queue://Store1.Incoming")
        e.subscribe("R", "r", "queue://Region.Incoming")
        e.subscribe("HQ", "h", "queue://HQ.Incoming")
        e.run_until_quiet()
        row = {"N": n, "mode": mode if ttl is None else f"mesh-ttl{ttl}"}
        row["store1_consumer"] = summarize(holders(e, "S1/c/in"), n)
        row["region_consumer"] = summarize(holders(e, "R/c/r"), n)
        row["hq_consumer"] = summarize(holders(e, "HQ/c/h"), n)
        hq = e.send("HQ", "queue://Store1.Incoming")
        s2 = e.send("S2", "queue://Store1.Incoming")
        e.run_until_quiet()
        got = set(e.delivered("S1", sub="in"))
        row["hq_to_store1_delivered"] = bool(set(hq) & got)
        row["store2_to_store1_delivered"] = bool(set(s2) & got)
        row["demand_total"] = e.count("demand.created") - e.count("demand.removed")
        row["s"] = round(time.time() - t, 1)
        print(json.dumps(row)); sys.stdout.flush()
