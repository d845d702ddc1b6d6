"""reasonrl.registry: the one names -> implementations idiom, and every pluggable part using it."""
import subprocess
import sys
import textwrap

import pytest

from reasonrl.registry import Registry, UnknownName


def test_register_lookup_build_and_the_unknown_name():
    reg = Registry("widget", config_key="widget.name")

    @reg.register("square")
    def square(x):
        return x * x

    reg.register("cube", lambda x: x ** 3)
    assert reg["square"] is square and reg.build("cube", 3) == 27
    assert list(reg) == ["cube", "square"] and len(reg) == 2 and "cube" in reg and "nope" not in reg
    assert reg.get("nope") is None  # Mapping.get: an UnknownName is a KeyError
    with pytest.raises(UnknownName) as err:
        reg["nope"]
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    assert str(err.value) == "unknown widget 'nope' (widget.name); known: cube, square."
    with pytest.raises(ValueError, match="widget 'square' is already registered"):
        reg.register("square", square)  # the same object twice is a mistake too
    with pytest.raises(ValueError, match="already registered"):
        reg.register("square", lambda x: x)
    reg.unregister("square")
    assert reg.names() == ["cube"]


def test_a_twin_from_a_second_import_is_accepted_and_a_check_rejects_other_kinds():
    def check(name, obj):
        if not isinstance(obj, type):
            raise TypeError(f"{name}: a class, please")
        obj.name = name
        return obj

    reg = Registry("thing", check=check)
    first = type("Thing", (), {"__module__": "reasonrl.things.a"})
    twin = type("Thing", (), {"__module__": "things.a"})  # the same file imported as another module
    other = type("Other", (), {"__module__": "reasonrl.things.a"})
    reg.register("t", first)
    reg.register("t", twin)
    assert reg["t"] is twin and twin.name == "t"
    with pytest.raises(ValueError, match="already registered"):
        reg.register("t", other)
    with pytest.raises(TypeError, match="a class, please"):
        reg.register("f", lambda: None)


def test_lazy_entries_import_nothing_until_asked_and_builtins_load_once():
    code = textwrap.dedent("""
        import sys
        from reasonrl.registry import Registry
        import reasonrl.sandboxes as sb
        print(sorted(sb.SANDBOXES), 'reasonrl.sandboxes.docker_pool' in sys.modules)
        print(sb.SANDBOXES['subprocess'].__name__, 'reasonrl.sandboxes.docker_pool' in sys.modules)
        reg = Registry('json thing', builtins=('json',))
        print('json' in sys.modules or 'not yet', reg.names())
        reg2 = Registry('lazy', builtins=())
        reg2.register_lazy('dumps', 'json:dumps')
        print(reg2['dumps']({'a': 1}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "['bwrap', 'docker', 'subprocess'] False"
    assert lines[1] == "SubprocessSandbox False"
    assert lines[3] == '{"a": 1}'


def test_every_pluggable_part_uses_the_registry():
    from reasonrl.algorithms import ADV_ESTIMATORS, KL_CONTROLLERS, KL_ESTIMATORS, POLICY_LOSSES
    from reasonrl.algorithms.aggregation import LOSS_AGGREGATIONS
    from reasonrl.datasets.common import RECIPES
    from reasonrl.envs import ENVIRONMENTS
    from reasonrl.envs.parsers import PARSERS
    from reasonrl.logging.loggers import LOGGERS
    from reasonrl.rollout import ENGINES
    from reasonrl.sandboxes import SANDBOXES
    from reasonrl.tools import TOOLS
    from reasonrl.verifiers.base import VERIFIERS

    expected = [
        (ADV_ESTIMATORS, {"grpo", "rloo", "gae"}), (POLICY_LOSSES, {"ppo_clip", "gspo"}), (KL_ESTIMATORS, {"k1", "k3"}),
        (KL_CONTROLLERS, {"fixed", "adaptive"}), (LOSS_AGGREGATIONS, {"token-mean"}), (RECIPES, {"arith", "gsm8k"}),
        (ENVIRONMENTS, {"python", "search", "code_feedback"}), (PARSERS, {"hermes", "fenced_python"}),
        (LOGGERS, {"console", "jsonl"}), (ENGINES, {"hf", "vllm"}), (SANDBOXES, {"bwrap", "docker"}),
        (TOOLS, {"python"}), (VERIFIERS, {"math", "code", "lean"}),
    ]
    for registry, names in expected:
        assert isinstance(registry, Registry), registry
        assert names <= set(registry), (registry.kind, sorted(registry))
        with pytest.raises(UnknownName, match=f"unknown {registry.kind} 'no-such-name'"):
            registry["no-such-name"]


def test_recipes_cover_every_task_and_an_unknown_one_is_a_data_error():
    from reasonrl.config.tasks import TASKS
    from reasonrl.datasets import DataError
    from reasonrl.datasets.common import RECIPES, recipe

    assert {t.recipe for t in TASKS.values()} <= set(RECIPES)
    assert hasattr(recipe("arith"), "build_rows")
    with pytest.raises(DataError, match="unknown dataset recipe 'nope'"):
        recipe("nope")
