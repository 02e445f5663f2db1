# shellcheck shell=bash disable=SC2015,SC2153  # A && B || C on purpose; ROOT, STATE, LOGS come from deploy/stack
# The Python test tools (Stripe's official library, the localstripe fake) in a venv under
# $STATE/py, installed from deploy/stripe-compat/requirements.txt and reinstalled only when
# that file changes (a stamp holds its hash), so CI pays for the pip install once.
PY_VENV="$STATE/py"
python_tools() {
  local req="$ROOT/deploy/stripe-compat/requirements.txt" stamp="$STATE/py/.requirements.sha256" want
  want="$(sha256sum "$req" | cut -d' ' -f1)"
  if [ -x "$PY_VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then return 0; fi
  log "installing the Python test tools into $PY_VENV (stripe, localstripe)"
  python3 -m venv "$PY_VENV" || die "cannot create the venv $PY_VENV (python3-venv missing?)"
  "$PY_VENV/bin/pip" install --quiet --disable-pip-version-check -r "$req" \
    || die "pip install -r $req failed"
  echo "$want" > "$stamp"
}
