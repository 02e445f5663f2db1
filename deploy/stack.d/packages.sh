# shellcheck shell=bash disable=SC2015,SC2153  # A && B || C on purpose; ROOT, STATE, LOGS come from deploy/stack
# The Debian packages the stack needs: the build and test tools here, each component's own
# through its NAME_packages hook, and extras per command (the browser for tests, bench tools).
# Root (or sudo) is asked for only when something is really missing.

# ensure_packages [chromium|bench|python|zbar]...
ensure_packages() {
  local want=() name extra t
  have cmake || want+=(cmake)
  have cc || want+=(build-essential)
  have pkg-config || want+=(pkg-config)
  have curl || want+=(curl)
  # Python venvs for the pinned test tools (schemathesis, Stripe's client, kubernetes-validate).
  have python3 || want+=(python3)
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || want+=(python3-venv)
  for name in $(components dep service); do
    # shellcheck disable=SC2207  # package names have no spaces
    want+=($(component_call "$name" packages))
  done
  for extra in "$@"; do
    case "$extra" in
      chromium) have chromium || want+=(chromium)
                # Japanese glyphs for the bilingual pages (screenshots, layout checks).
                dpkg -s fonts-ipafont-gothic >/dev/null 2>&1 || want+=(fonts-ipafont-gothic) ;;
      bench) for t in wrk nginx hyperfine jq; do have "$t" || want+=("$t"); done
             have pgbench || [ -x "$(pg_bin)/pgbench" ] || want+=(postgresql-contrib)
             have redis-benchmark || want+=(redis-tools) ;;
      python) ;;  # python3 and python3-venv are in the base list above
      # An independent QR decoder: the tests decode the codes in delivered e-mail with it.
      zbar) have zbarimg || want+=(zbar-tools) ;;
    esac
  done
  # shellcheck disable=SC2207  # one package name per line
  want=($(printf '%s\n' "${want[@]}" | awk 'NF && !seen[$0]++'))
  apt_install "${want[@]}"
}
