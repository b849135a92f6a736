"""Load polarproxy's recorder into a plain mitmproxy:

    mitmdump -s addons/polarproxy_recorder.py --mode reverse:http://127.0.0.1:30000 \
        --set polarproxy_model=./tiny [--set polarproxy_db=calls.db] [--set polarproxy_episode=ID]

The reverse target is the backend (SGLang-compatible /generate) unless polarproxy_backend says otherwise.
"""

from polarproxy.capture.addon import Recorder

addons = [Recorder()]
