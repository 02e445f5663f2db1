# shellcheck shell=bash disable=SC2015,SC2153  # A && B || C on purpose; ROOT, STATE, LOGS come from deploy/stack
# The local SMTP server: deploy/smtp/mailsink.py on Debian's python3-aiosmtpd, a real SMTP
# server that keeps what it accepts in a Maildir under .stack/mail and shows it over HTTP
# (DESIGN section 9, "Ports": SMTP 2525, its mail view 2580). Booking mails tickets to it on
# the local stack; the tests read the delivered messages from it. It relays nothing.
SMTP_PORT="${FLOODGATE_SMTP_PORT:-2525}"
MAIL_VIEW_PORT="${FLOODGATE_MAIL_VIEW_PORT:-2580}"
# Debian's interpreter, whatever python3 comes first on the PATH (pyenv's has no aiosmtpd).
SMTP_PYTHON=/usr/bin/python3
register_component 30 smtp dep

smtp_packages() {
  [ -x "$SMTP_PYTHON" ] && "$SMTP_PYTHON" -c 'import aiosmtpd' 2>/dev/null || echo python3-aiosmtpd
}

# Ours: alive and running this checkout's mailsink.py (pid files outlive crashes).
smtp_is_ours() {
  local pid; pid="$(cat "$STATE/smtp.pid" 2>/dev/null || true)"
  [ -n "$pid" ] && is_alive "$pid" && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "deploy/smtp/mailsink.py"
}

smtp_ports() {
  smtp_is_ours && return 0
  echo "FLOODGATE_SMTP_PORT 127.0.0.1 $SMTP_PORT"
  echo "FLOODGATE_MAIL_VIEW_PORT 127.0.0.1 $MAIL_VIEW_PORT"
}

smtp_start() {
  if smtp_is_ours; then return 0; fi
  rm -f "$STATE/smtp.pid"
  mkdir -p "$STATE/mail" "$LOGS"
  log "starting the local SMTP server on 127.0.0.1:$SMTP_PORT (mail view http://127.0.0.1:$MAIL_VIEW_PORT/)"
  nohup "$SMTP_PYTHON" "$ROOT/deploy/smtp/mailsink.py" --smtp-port "$SMTP_PORT" \
    --http-port "$MAIL_VIEW_PORT" --maildir "$STATE/mail" >>"$LOGS/smtp.log" 2>&1 &
  echo $! > "$STATE/smtp.pid"
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$MAIL_VIEW_PORT/api/stats" >/dev/null 2>&1 && return 0
    is_alive "$(cat "$STATE/smtp.pid")" || { tail -20 "$LOGS/smtp.log" >&2; die "the SMTP server exited"; }
    sleep 0.1
  done
  tail -20 "$LOGS/smtp.log" >&2; die "the SMTP server did not start"
}

smtp_stop() {
  smtp_is_ours || { rm -f "$STATE/smtp.pid"; return 0; }
  local pid; pid="$(cat "$STATE/smtp.pid")"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do is_alive "$pid" || break; sleep 0.1; done
  is_alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$STATE/smtp.pid"
}

smtp_status() {
  if smtp_is_ours; then
    echo "smtp: running (pid $(cat "$STATE/smtp.pid"), SMTP 127.0.0.1:$SMTP_PORT, mail http://127.0.0.1:$MAIL_VIEW_PORT/)"
  else
    echo "smtp: stopped"
  fi
}
