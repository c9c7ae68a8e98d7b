"""What people read: output off a terminal is never wrapped, and idle and ingress nodes
say what they are instead of JOIN forever."""

from __future__ import annotations

import io
import re
from typing import Any

from otela.console import make_console
from otela.demo import _print_registry
from otela.registry.records import Lifecycle, ModelInfo, NodeRecord, display_state

PEER = "12D3KooW" + "A" * 44
MULTIADDR = f"/ip4/203.0.113.77/tcp/43905/p2p/{PEER}"
FULL = re.compile(r"/ip4/[0-9.]+/tcp/\d+/p2p/12D3KooW[1-9A-HJ-NP-Za-km-z]{44}")


class FakeIngress:
    http_url = "http://203.0.113.77:8092"

    def nodes(self) -> list[dict[str, Any]]:
        record = NodeRecord("s" * 32, PEER, "a-provider-with-a-long-name", Lifecycle.JOIN, 3,
                            "http://203.0.113.77:8092", addrs=(MULTIADDR,), ingress=True,
                            idle=True)
        return [{**record.to_dict(), "display_state": display_state(record)}]


def test_piped_output_keeps_each_multiaddr_on_one_line() -> None:
    out = io.StringIO()  # what `otela demo | cat` writes to: not a terminal
    console = make_console(out)
    console.print(f"ingress  [bold]{FakeIngress.http_url}[/]  {MULTIADDR}  " + "x" * 80)
    _print_registry(console, FakeIngress())  # type: ignore[arg-type]
    text = out.getvalue()
    assert len(FULL.findall(text)) == 1 and MULTIADDR in text.splitlines()[0]
    table = [line for line in text.splitlines() if "a-provider-with-a-long-name" in line]
    assert len(table) == 1 and "http://203.0.113.77:8092" in table[0], text
    assert "INGRESS" in table[0]
    assert "\x1b[" not in text  # no colour codes in a file


def test_a_terminal_console_keeps_rich_defaults() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert make_console(Tty(), width=50).width == 50
    assert make_console(io.StringIO()).width > 1000


def record(**changes: Any) -> NodeRecord:
    base = NodeRecord("s", "p", "prov", Lifecycle.JOIN, 1, "http://h")
    return NodeRecord(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, **changes})


def test_display_state_names_idle_and_ingress_nodes_without_touching_the_lattice() -> None:
    assert display_state(record(idle=True, ingress=True)) == "INGRESS"
    assert display_state(record(idle=True)) == "IDLE"
    assert display_state(record(engine="vllm")) == "JOIN"  # an engine still loading
    serving = record(state=Lifecycle.SERVING, ingress=True, models=(ModelInfo("m"),))
    assert display_state(serving) == "SERVING"
    for state in (Lifecycle.DOWN, Lifecycle.LEFT):
        assert display_state(record(state=state, idle=True, ingress=True)) == state.name
    idle = record(idle=True, ingress=True)
    assert "display_state" not in idle.to_dict()  # not on the wire, not signed
    assert idle.state is Lifecycle.JOIN


def test_doctor_shows_a_peers_display_state_next_to_its_lifecycle_state() -> None:
    from otela.doctor import render

    ingress = {**record(idle=True, ingress=True).to_dict(), "display_state": "INGRESS"}
    text = render({"self": {}, "nat": {}, "peer": {"peer_id": "p", "record": ingress}}, "p")
    assert "state     INGRESS (JOIN), reachability unknown" in text
    serving = {**ingress, "state": "SERVING", "display_state": "SERVING"}
    text = render({"self": {}, "nat": {}, "peer": {"peer_id": "p", "record": serving}}, "p")
    assert "state     SERVING, reachability" in text


def test_names_from_the_federation_are_printed_as_written_not_as_markup() -> None:
    from simulator.placer.render import show_diff

    out = io.StringIO()
    show_diff([{"model": "[/m]", "gpu": "[red]H100", "tp": 1, "now": 0, "planned": 1,
                "change": 1}], make_console(out))
    assert "[/m]" in out.getvalue() and "[red]H100" in out.getvalue()

    class MarkupIngress(FakeIngress):
        def nodes(self) -> list[dict[str, Any]]:
            nodes = super().nodes()
            nodes[0]["provider_id"] = "[/evil]"
            return nodes

    out = io.StringIO()
    _print_registry(make_console(out), MarkupIngress())  # type: ignore[arg-type]
    assert "[/evil]" in out.getvalue()
