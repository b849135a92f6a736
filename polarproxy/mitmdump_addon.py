"""Load polarproxy's recorder into a plain mitmproxy (from a checkout, `addons/polarproxy_recorder.py` is this
file; from an installed wheel, `python -m polarproxy.mitmdump_addon` prints its path):

    mitmdump --listen-host 127.0.0.1 -s addons/polarproxy_recorder.py --mode reverse:http://127.0.0.1:30000 \
        --set polarproxy_model=./tiny [--set polarproxy_db=calls.db] [--set polarproxy_episode=ID]

The reverse target is the backend (SGLang-compatible /generate) unless polarproxy_backend says otherwise.
"""

if __name__ == "__main__":  # `mitmdump -s "$(python -m polarproxy.mitmdump_addon)"`: the path to load
    print(__file__)
else:
    from polarproxy.capture.addon import Recorder

    addons = [Recorder()]
