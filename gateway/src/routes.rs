//! What a request is, decided from its method and path alone (a pure function, unit-tested
//! without a socket). The proxy acts on the [`Route`]; nothing else parses paths.

use http::Method;
use shared::ids::is_valid_slug;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    Healthz,
    Readyz,
    Metrics,
    /// `GET /openapi.json`: this listener's OpenAPI document.
    OpenApi,
    DevLogin,
    Join(&'a str),
    /// `POST /queue/{event}/register`: a fan registers for a registered room.
    Register(&'a str),
    Status(&'a str),
    /// Seed commitment / reveal of the pre-sale draw.
    Draw(&'a str),
    /// Checks a place receipt.
    Receipt(&'a str),
    /// Proof-of-work challenge for joining.
    Challenge(&'a str),
    /// `POST /webhooks/payments`: forwarded without an admission token (signed by the provider).
    Webhook,
    /// `/api/…` and `/ws/…`: forwarded only with a valid admission token. `event` is set on
    /// event-scoped paths (`/api/events/{event}/…`), where the token's `evt` must match.
    Api {
        event: Option<&'a str>,
    },
    /// A static file, by its key in the page table.
    Page(&'a str),
    /// A page of an event: `/e/{event}`, `/e/{event}/shop`, `/e/{event}/tickets`.
    EventPage {
        event: &'a str,
        page: EventPage,
    },
    UnknownEvent,
    MethodNotAllowed,
    BadPath,
    NotFound,
}

/// Which page of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventPage {
    /// The waiting room.
    Waiting,
    /// The storefront (admitted fans).
    Shop,
    /// The fan's tickets (class `public` as a page; it reads the tickets with the fan's login
    /// token, long after admission ended).
    Tickets,
}

impl EventPage {
    /// The file that serves it.
    pub fn file(self) -> &'static str {
        match self {
            EventPage::Waiting => "/waiting.html",
            EventPage::Shop => "/shop.html",
            EventPage::Tickets => "/tickets.html",
        }
    }
}

/// Routes of the public listener.
pub fn public<'a>(method: &Method, path: &'a str) -> Route<'a> {
    let get = method == Method::GET || method == Method::HEAD;
    let post = method == Method::POST;
    if !path.starts_with('/') || path.len() > 2048 {
        return Route::BadPath;
    }
    if path.starts_with("/api/") || path.starts_with("/ws/") {
        if !is_clean(path) {
            return Route::BadPath;
        }
        let event = path
            .strip_prefix("/api/events/")
            .map(|rest| rest.split('/').next().unwrap_or(""));
        return Route::Api { event };
    }
    match path {
        "/healthz" => {
            return if get {
                Route::Healthz
            } else {
                Route::MethodNotAllowed
            };
        }
        "/readyz" => {
            return if get {
                Route::Readyz
            } else {
                Route::MethodNotAllowed
            };
        }
        "/metrics" => {
            return if get {
                Route::Metrics
            } else {
                Route::MethodNotAllowed
            };
        }
        "/openapi.json" => {
            return if get {
                Route::OpenApi
            } else {
                Route::MethodNotAllowed
            };
        }
        "/dev/login" => {
            return if post {
                Route::DevLogin
            } else {
                Route::MethodNotAllowed
            };
        }
        "/webhooks/payments" => {
            return if post {
                Route::Webhook
            } else {
                Route::MethodNotAllowed
            };
        }
        "/" => {
            return if get {
                Route::Page("/index.html")
            } else {
                Route::MethodNotAllowed
            };
        }
        _ => {}
    }
    if let Some(rest) = path.strip_prefix("/queue/") {
        let (event, action) = rest.split_once('/').unwrap_or((rest, ""));
        if !is_valid_slug(event) {
            return Route::UnknownEvent;
        }
        return match (action, get, post) {
            ("join", _, true) => Route::Join(event),
            ("register", _, true) => Route::Register(event),
            ("status", true, _) => Route::Status(event),
            ("draw", true, _) => Route::Draw(event),
            ("receipt", _, true) => Route::Receipt(event),
            ("challenge", true, _) => Route::Challenge(event),
            ("join" | "register" | "status" | "draw" | "receipt" | "challenge", _, _) => {
                Route::MethodNotAllowed
            }
            _ => Route::NotFound,
        };
    }
    if let Some(rest) = path.strip_prefix("/e/") {
        let rest = rest.trim_end_matches('/');
        let (event, tail) = rest.split_once('/').unwrap_or((rest, ""));
        if !is_valid_slug(event) {
            return Route::NotFound;
        }
        if !get {
            return Route::MethodNotAllowed;
        }
        return match tail {
            "" => Route::EventPage {
                event,
                page: EventPage::Waiting,
            },
            "shop" => Route::EventPage {
                event,
                page: EventPage::Shop,
            },
            "tickets" => Route::EventPage {
                event,
                page: EventPage::Tickets,
            },
            _ => Route::NotFound,
        };
    }
    if is_booking_only(path) {
        return Route::NotFound;
    }
    if get {
        Route::Page(path)
    } else {
        Route::NotFound
    }
}

/// `/ops` and below: booking's ops page, served on booking's internal listener only (it
/// takes the admin secret). The public listener never serves or forwards it, even if
/// `static_dir` holds its files (`pages` skips `static/ops/` as well).
pub fn is_booking_only(path: &str) -> bool {
    path == "/ops" || path.starts_with("/ops/")
}

/// Refuses dot segments, encoded dots/slashes/backslashes and empty segments, so the path
/// booking routes on is the path the gateway checked.
fn is_clean(path: &str) -> bool {
    let lower_has = |needle: &str| {
        path.as_bytes()
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
    };
    !path.contains("//")
        && !path.contains('\\')
        && !lower_has("%2e")
        && !lower_has("%2f")
        && !lower_has("%5c")
        && !lower_has("%00")
        && path.split('/').skip(1).all(|seg| seg != "." && seg != "..")
}

/// The methods `path` answers on the public listener, for the `Allow` header of a `405`
/// (built only then: a `405` is rare and off the hot path).
pub fn public_allow(path: &str) -> String {
    allow(|m| {
        !matches!(
            public(m, path),
            Route::MethodNotAllowed | Route::NotFound | Route::UnknownEvent | Route::BadPath
        )
    })
}

/// The methods `path` answers on the admin listener, for the `Allow` header of a `405`.
pub fn admin_allow(path: &str) -> String {
    allow(|m| {
        !matches!(
            admin(m, path),
            AdminRoute::MethodNotAllowed | AdminRoute::NotFound | AdminRoute::UnknownEvent
        )
    })
}

fn allow(answers: impl Fn(&Method) -> bool) -> String {
    [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
    ]
    .iter()
    .filter(|m| answers(m))
    .map(Method::as_str)
    .collect::<Vec<_>>()
    .join(", ")
}

/// Routes of the admin listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRoute<'a> {
    Healthz,
    Readyz,
    Metrics,
    /// `GET /openapi.json`: the admin listener's OpenAPI document (no auth: it holds no secret).
    OpenApi,
    GetConfig(&'a str),
    PutConfig(&'a str),
    Revoke(&'a str),
    SoldOut(&'a str),
    /// `PUT` / `GET /admin/events/{event}/registrations`.
    PutRegistrations(&'a str),
    GetRegistrations(&'a str),
    /// `GET /admin/events/{event}/audit`: the config audit log, newest first.
    Audit(&'a str),
    /// `GET`/`POST /admin/events/{event}/schedule`: pending changes; schedule one.
    Schedule(&'a str),
    AddChange(&'a str),
    /// `GET`/`PUT`/`DELETE /admin/events/{event}/schedule/{id}`.
    Change(&'a str, &'a str),
    EditChange(&'a str, &'a str),
    CancelChange(&'a str, &'a str),
    UnknownEvent,
    MethodNotAllowed,
    NotFound,
}

pub fn admin<'a>(method: &Method, path: &'a str) -> AdminRoute<'a> {
    let get = method == Method::GET || method == Method::HEAD;
    match path {
        "/healthz" | "/readyz" | "/metrics" | "/openapi.json" if !get => {
            return AdminRoute::MethodNotAllowed;
        }
        "/healthz" => return AdminRoute::Healthz,
        "/readyz" => return AdminRoute::Readyz,
        "/metrics" => return AdminRoute::Metrics,
        "/openapi.json" => return AdminRoute::OpenApi,
        _ => {}
    }
    let Some(rest) = path.strip_prefix("/admin/events/") else {
        return AdminRoute::NotFound;
    };
    let Some((event, action)) = rest.split_once('/') else {
        return AdminRoute::NotFound;
    };
    if !is_valid_slug(event) {
        return AdminRoute::UnknownEvent;
    }
    if let Some(id) = action.strip_prefix("schedule/") {
        if !is_valid_slug(id) {
            return AdminRoute::NotFound;
        }
        return match *method {
            Method::GET => AdminRoute::Change(event, id),
            Method::PUT => AdminRoute::EditChange(event, id),
            Method::DELETE => AdminRoute::CancelChange(event, id),
            _ => AdminRoute::MethodNotAllowed,
        };
    }
    match (action, method) {
        ("audit", &Method::GET) => AdminRoute::Audit(event),
        ("schedule", &Method::GET) => AdminRoute::Schedule(event),
        ("schedule", &Method::POST) => AdminRoute::AddChange(event),
        ("audit" | "schedule", _) => AdminRoute::MethodNotAllowed,
        ("config", &Method::GET) => AdminRoute::GetConfig(event),
        ("config", &Method::PUT) => AdminRoute::PutConfig(event),
        ("revoke", &Method::POST) => AdminRoute::Revoke(event),
        ("sold_out", &Method::PUT) => AdminRoute::SoldOut(event),
        ("registrations", &Method::PUT) => AdminRoute::PutRegistrations(event),
        ("registrations", &Method::GET) => AdminRoute::GetRegistrations(event),
        ("config" | "revoke" | "sold_out" | "registrations", _) => AdminRoute::MethodNotAllowed,
        _ => AdminRoute::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_routes() {
        let g = Method::GET;
        let p = Method::POST;
        assert_eq!(public(&p, "/queue/demo/join"), Route::Join("demo"));
        assert_eq!(public(&g, "/queue/demo/join"), Route::MethodNotAllowed);
        assert_eq!(public(&g, "/queue/demo/status"), Route::Status("demo"));
        assert_eq!(public(&g, "/queue/De{mo}/status"), Route::UnknownEvent);
        assert_eq!(public(&g, "/queue/demo/other"), Route::NotFound);
        assert_eq!(
            public(&g, "/api/events/demo/seats"),
            Route::Api {
                event: Some("demo")
            }
        );
        assert_eq!(public(&p, "/api/orders"), Route::Api { event: None });
        assert_eq!(public(&g, "/ws/auctions/x"), Route::Api { event: None });
        assert_eq!(public(&g, "/api/../admin/events"), Route::BadPath);
        assert_eq!(public(&g, "/api/%2e%2e/admin"), Route::BadPath);
        assert_eq!(public(&g, "/api//x"), Route::BadPath);
        assert_eq!(public(&p, "/webhooks/payments"), Route::Webhook);
        assert_eq!(public(&g, "/openapi.json"), Route::OpenApi);
        assert_eq!(public(&p, "/openapi.json"), Route::MethodNotAllowed);
        assert_eq!(admin(&g, "/openapi.json"), AdminRoute::OpenApi);
        assert_eq!(public(&g, "/webhooks/payments"), Route::MethodNotAllowed);
        assert_eq!(
            public(&g, "/e/demo"),
            Route::EventPage {
                event: "demo",
                page: EventPage::Waiting
            }
        );
        assert_eq!(
            public(&g, "/e/demo/"),
            Route::EventPage {
                event: "demo",
                page: EventPage::Waiting
            }
        );
        assert_eq!(
            public(&g, "/e/demo/shop"),
            Route::EventPage {
                event: "demo",
                page: EventPage::Shop
            }
        );
        assert_eq!(
            public(&g, "/e/demo/tickets"),
            Route::EventPage {
                event: "demo",
                page: EventPage::Tickets
            }
        );
        assert_eq!(
            public(&g, "/e/demo/tickets/"),
            Route::EventPage {
                event: "demo",
                page: EventPage::Tickets
            }
        );
        assert_eq!(public(&p, "/e/demo/tickets"), Route::MethodNotAllowed);
        assert_eq!(public(&g, "/e/demo/tickets/x"), Route::NotFound);
        assert_eq!(public(&g, "/e/DEMO/tickets"), Route::NotFound);
        assert_eq!(public(&g, "/tickets-sw.js"), Route::Page("/tickets-sw.js"));
        assert_eq!(public(&g, "/e/DEMO"), Route::NotFound);
        assert_eq!(public(&g, "/"), Route::Page("/index.html"));
        assert_eq!(public(&g, "/waiting.js"), Route::Page("/waiting.js"));
        assert_eq!(public(&g, "relative"), Route::BadPath);
        assert_eq!(public(&p, "/dev/login"), Route::DevLogin);
        for ops in [
            "/ops",
            "/ops/",
            "/ops/ops.html",
            "/ops/ops.js",
            "/ops/ops-i18n.js",
        ] {
            assert_eq!(public(&g, ops), Route::NotFound, "{ops}");
        }
        assert_eq!(public(&g, "/opsx.js"), Route::Page("/opsx.js"));
        assert_eq!(public(&p, "/queue/demo/register"), Route::Register("demo"));
        assert_eq!(public(&g, "/queue/demo/register"), Route::MethodNotAllowed);
    }

    #[test]
    fn a_405_names_the_methods_the_path_answers() {
        assert_eq!(public_allow("/queue/demo/join"), "POST");
        assert_eq!(public_allow("/queue/demo/status"), "GET, HEAD");
        assert_eq!(public_allow("/healthz"), "GET, HEAD");
        assert_eq!(admin_allow("/admin/events/demo/config"), "GET, PUT");
        assert_eq!(
            admin_allow("/admin/events/demo/schedule/c1"),
            "GET, PUT, DELETE"
        );
        assert_eq!(admin_allow("/admin/events/demo/schedule"), "GET, POST");
        assert_eq!(admin_allow("/openapi.json"), "GET, HEAD");
        assert_eq!(
            admin(&Method::POST, "/healthz"),
            AdminRoute::MethodNotAllowed
        );
        assert_eq!(admin(&Method::HEAD, "/healthz"), AdminRoute::Healthz);
    }

    #[test]
    fn admin_routes() {
        assert_eq!(
            admin(&Method::PUT, "/admin/events/demo/config"),
            AdminRoute::PutConfig("demo")
        );
        assert_eq!(
            admin(&Method::GET, "/admin/events/demo/config"),
            AdminRoute::GetConfig("demo")
        );
        assert_eq!(
            admin(&Method::DELETE, "/admin/events/demo/config"),
            AdminRoute::MethodNotAllowed
        );
        assert_eq!(
            admin(&Method::POST, "/admin/events/demo/revoke"),
            AdminRoute::Revoke("demo")
        );
        assert_eq!(
            admin(&Method::GET, "/admin/events/x:y/config"),
            AdminRoute::UnknownEvent
        );
        assert_eq!(admin(&Method::GET, "/admin/other"), AdminRoute::NotFound);
        assert_eq!(
            admin(&Method::PUT, "/admin/events/demo/registrations"),
            AdminRoute::PutRegistrations("demo")
        );
        assert_eq!(
            admin(&Method::GET, "/admin/events/demo/registrations"),
            AdminRoute::GetRegistrations("demo")
        );
        assert_eq!(
            admin(&Method::POST, "/admin/events/demo/registrations"),
            AdminRoute::MethodNotAllowed
        );
        assert_eq!(
            admin(&Method::GET, "/admin/events/demo/audit"),
            AdminRoute::Audit("demo")
        );
        assert_eq!(
            admin(&Method::POST, "/admin/events/demo/schedule"),
            AdminRoute::AddChange("demo")
        );
        assert_eq!(
            admin(&Method::DELETE, "/admin/events/demo/schedule/c1"),
            AdminRoute::CancelChange("demo", "c1")
        );
        assert_eq!(
            admin(&Method::POST, "/admin/events/demo/schedule/c1"),
            AdminRoute::MethodNotAllowed
        );
        assert_eq!(
            admin(&Method::GET, "/admin/events/demo/schedule/C:1"),
            AdminRoute::NotFound
        );
    }
}
