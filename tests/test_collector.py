"""Viking's own work inside ComfyUI's calls starts no garbage collection: a collection of the
oldest generation walks the whole heap (0.25 s in a 0.33 server with a Flux-shaped model), and
Viking's allocations must not bring one into a prompt (comfy_node/timing.py says how)."""
import gc
import threading

from conftest import run_checks

from comfy_node import timing


def test_viking_attach_events_and_home_watch_start_no_collection(comfy_env):
    run_checks(comfy_env, "collector_check.py", expected=5)


def test_holds_of_two_threads_nest_and_give_collection_back_as_it_was():
    assert gc.isenabled()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        timing.hold_collector()
        first_in.set()
        second_in.wait(5)
        timing.release_collector()
        seen["after first"] = gc.isenabled()
        first_out.set()

    def second():
        first_in.wait(5)
        timing.hold_collector()
        second_in.set()
        first_out.wait(5)
        seen["second alone"] = gc.isenabled()
        timing.release_collector()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == {"after first": False, "second alone": False} and gc.isenabled()
    gc.disable()  # someone else switched it off: a hold leaves it off
    try:
        timing.hold_collector()
        timing.release_collector()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_held_function_gives_collection_back_when_it_raises():
    @timing.holds_collector
    def failing():
        assert not gc.isenabled()
        raise ValueError("bad input")

    try:
        failing()
    except ValueError:
        pass
    assert gc.isenabled() and timing._collector_holders == 0


def test_the_identity_key_is_one_object_and_still_tells_every_change():
    """The key kept between events is one bytes object (no tuple a weight for the collector to
    count), and tells apart what the tuples did: another tensor, `.data` set anew, a wrapper's
    inner tensor swapped, and lists whose numbers run together differently."""
    import torch

    from comfy_node.weights import identity_key, range_key

    class Wrapper(torch.Tensor):  # a tensor subclass whose parts live in its __dict__
        pass

    plain = [torch.zeros(4), torch.ones(4)]
    wrapper = torch.zeros(4).as_subclass(Wrapper)
    wrapper.scale = torch.ones(1)
    key = identity_key(plain + [wrapper])
    assert type(key) is bytes and not gc.is_tracked(key) and key == identity_key(plain + [wrapper])
    plain[0].data = torch.zeros(4)
    assert identity_key(plain + [wrapper]) != key
    key = identity_key(plain + [wrapper])
    wrapper.scale = torch.ones(1)
    assert identity_key(plain + [wrapper]) != key
    assert identity_key(plain) != identity_key(plain[:1]) and identity_key([wrapper]) != identity_key(plain)
    assert range_key([(1, 2), (3, 4)]) != range_key([(1, 2, None)]) and range_key([(1, 2, "x")]) == range_key([(1, 2)])
