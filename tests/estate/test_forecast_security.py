"""treefed forecast honours the configs' [security]: links log in as treefed broker would
(certificate or password, broker role), and the real Guard screens what each accepted
link carries (permissions, tree confinement); the routes it refuses are reported."""

from __future__ import annotations

import json
from pathlib import Path

from tests.estate.test_activemq import cli
from tests.estate.test_generate import EXAMPLE
from treefed.estate.forecast import forecast, load_estate, write_forecast
from treefed.estate.generate import generate, load_description

R1 = [f"region-1-store-000{i}" for i in (1, 2, 3)]


def example(tmp_path: Path) -> Path:
    """HQ -> 2 regions -> 3 stores, mutual TLS, links authenticated by certificate."""
    out = tmp_path / "estate"
    generate(load_description(EXAMPLE), out)
    return out


def routes(result: dict, key: str) -> set[tuple[str, str]]:
    return {(r["from"], r["dst"]) for r in result["security"][key]}


class TestForecastSecurity:
    def test_generated_estate_routes_everything(self, tmp_path):
        """Every link logs in by certificate as its broker, nothing is denied: the
        secured run delivers what the open one does."""
        r = forecast(load_estate([example(tmp_path)]))
        sec = r["security"]
        assert sec["logins"] == {"certificate": 8} and sec["links_refused"] == []
        assert sec["denied"] == [] and sec["routes_refused"] == []
        msgs = r["current"]["messages"]
        assert msgs["delivered"] == msgs["sent"] == sec["without_security"]["messages"][
            "delivered"] > 0

    def test_tree_confinement_refuses_store_to_store_routes(self, tmp_path):
        """region-1 confines its children to their own queues (up to HQ allowed): the
        three store-to-store messages leaving region-1's stores are refused at region-1
        (outside the tree scope) and reported as refused routes; the rest is delivered."""
        folder = example(tmp_path)
        cfg = folder / "region-1.toml"
        cfg.write_text(cfg.read_text() + '\n[security.tree]\nconfine_children = true\n'
                       'child_patterns = ["queue://Store.{child}.>"]\n'
                       'upward = ["queue://HQ.>"]\n')
        r = forecast(load_estate([folder]))
        sec = r["security"]
        assert sec["links_refused"] == []
        nxt = {R1[0]: R1[1], R1[1]: R1[2], R1[2]: "region-2-store-0001"}
        assert routes(r, "routes_refused") == {
            (s, f"queue://Store.{d}.Incoming") for s, d in nxt.items()}
        assert {(d["broker"], d["link"], d["permission"]) for d in sec["denied"]} == {
            ("region-1", s, "write") for s in R1}
        assert all("outside the tree scope" in d["reason"] for d in sec["denied"])
        msgs = r["current"]["messages"]
        assert msgs["stranded"] == 3 and msgs["sent"] - 3 == msgs["delivered"]
        assert sec["without_security"]["messages"]["stranded"] == 0
        write_forecast(r, tmp_path / "out")
        md = (tmp_path / "out" / "forecast.md").read_text()
        assert "Routes the security config refuses (delivered without it, stranded with " \
               "it): 3" in md and "outside the tree scope of region-1-store-0001" in md

    def test_permission_and_login_refusals(self, tmp_path):
        """region-2 stops its brokers writing HQ queues and no longer knows the user of
        region-2-store-0001: that store's link is refused (its certificate names no
        configured user), the other two stores' messages to HQ are denied."""
        folder = example(tmp_path)
        cfg = folder / "region-2.toml"
        text = cfg.read_text().replace(
            '[[security.user]]\nname = "region-2-store-0001"\ngroups = ["brokers"]\n\n', "")
        text = text.replace('principal = "group:brokers"\nread = [">"]\nwrite = [">"]',
                            'principal = "group:brokers"\nread = [">"]\n'
                            'write = ["queue://Store.>"]')
        cfg.write_text(text)
        r = forecast(load_estate([folder]))
        sec = r["security"]
        (refused,) = sec["links_refused"]
        assert (refused["dialer"], refused["acceptor"], refused["method"]) == \
            ("region-2-store-0001", "region-2", "certificate")
        assert "names no configured user" in refused["reason"]
        assert {(d["link"], d["permission"], d["dst"]) for d in sec["denied"]} == {
            (s, "write", "queue://HQ.Incoming")
            for s in ("region-2-store-0002", "region-2-store-0003")}
        lost = routes(r, "routes_refused")
        assert {(f"region-2-store-000{i}", "queue://HQ.Incoming") for i in (1, 2, 3)} <= lost
        assert ("hq", "queue://Store.region-2-store-0001.Incoming") in lost

    def test_open_estate_says_security_does_not_apply(self, tmp_path):
        """Configs without [security] (an ActiveMQ import): no security section to
        apply, said so in forecast.md; through the CLI as well."""
        folder = tmp_path / "open"
        desc = EXAMPLE.read_text().split("[tls]")[0]   # no TLS, users or permissions
        (tmp_path / "open.toml").write_text(desc)
        assert cli("estate", "generate", str(tmp_path / "open.toml"), "--out",
                   str(folder)).returncode == 0
        done = cli("forecast", str(folder), "--out", str(tmp_path / "f"))
        assert done.returncode == 0, done.stderr
        assert json.loads((tmp_path / "f" / "forecast.json").read_text())["security"] is None
        assert "No config authenticates links" in (tmp_path / "f" / "forecast.md").read_text()
