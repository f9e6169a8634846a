//! Client-side rate limit of API requests: kube-proxy's `--kube-api-qps` and
//! `--kube-api-burst` (`clientConnection.qps`, `.burst`).
//!
//! client-go's token bucket: `burst` requests may go at once, then `qps` per
//! second. Every request takes a token, a watch each time it is (re)opened, so a
//! flapping API server is not hammered by relists. As in client-go, a qps of 0
//! means the default (5), a burst of 0 the default (10), and a negative qps no
//! limit at all.
//!
//! One list is one request, however many pages it comes in: a request that
//! continues a paged list (`continue=` in its query) takes no token. kube-proxy's
//! informers list at `resourceVersion=0`, which the API server answers from its
//! watch cache in one response whatever the `limit`; our watchers read a
//! consistent list in pages of 500 (so the objects stream into the model instead
//! of being held as one decoded list), and at the default 5 per second a token per
//! page would hold a 44k-Service first list back for half a minute.
//!
//! The limit is a [`Layer`] on kube's client stack. A request's future waits for
//! its token before it polls the inner service's future (which, in kube's
//! stack, sends nothing until polled): the layer sees the request, so it can
//! tell a continued page from a new request.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

/// client-go's `DefaultQPS`.
pub const DEFAULT_QPS: f32 = 5.0;
/// client-go's `DefaultBurst`.
pub const DEFAULT_BURST: i32 = 10;

/// A token bucket: `burst` tokens, refilled at `qps` per second. Pure: the
/// caller says what time it is.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Takes a token at `now`, or says how long until there is one.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 || self.qps <= 0.0 || self.qps.is_nan() {
            self.tokens = (self.tokens - 1.0).max(0.0);
            Ok(())
        } else {
            Err(Duration::try_from_secs_f64((1.0 - self.tokens) / self.qps)
                .unwrap_or(Duration::MAX))
        }
    }
}

/// The rate limit of `--kube-api-qps` and `--kube-api-burst`, with client-go's
/// reading of 0 and negative values; `None` when there is no limit.
pub fn limit_of(qps: f32, burst: i32) -> Option<RateLimitLayer> {
    let qps = if qps == 0.0 { DEFAULT_QPS } else { qps };
    let burst = if burst == 0 { DEFAULT_BURST } else { burst };
    (qps > 0.0 && qps.is_finite()).then(|| RateLimitLayer {
        qps: f64::from(qps),
        burst: u32::try_from(burst).unwrap_or(1),
    })
}

/// Puts a [`RateLimited`] around a service.
#[derive(Debug, Clone, Copy)]
pub struct RateLimitLayer {
    qps: f64,
    burst: u32,
}

impl RateLimitLayer {
    /// Requests per second.
    pub fn qps(&self) -> f64 {
        self.qps
    }

    /// Requests allowed at once.
    pub fn burst(&self) -> u32 {
        self.burst
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            bucket: Arc::new(Mutex::new(TokenBucket::new(
                self.qps,
                self.burst,
                Instant::now(),
            ))),
        }
    }
}

/// A service whose requests wait for a token of the bucket, but for the later
/// pages of a paged list.
pub struct RateLimited<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for RateLimited<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimited")
            .field("inner", &self.inner)
            .field("bucket", &self.bucket)
            .finish()
    }
}

/// Whether `uri` asks for a later page of a paged list (a non-empty `continue`).
pub fn continues_a_list(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&').any(|pair| {
            pair.strip_prefix("continue=")
                .is_some_and(|t| !t.is_empty())
        })
    })
}

/// Waits until `bucket` gives a token.
async fn token(bucket: Arc<Mutex<TokenBucket>>) {
    loop {
        let taken = bucket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(Instant::now());
        match taken {
            Ok(()) => return,
            Err(delay) => tokio::time::sleep(delay).await,
        }
    }
}

impl<S, B> Service<http::Request<B>> for RateLimited<S>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let free = continues_a_list(req.uri());
        let response = self.inner.call(req);
        if free {
            return Box::pin(response);
        }
        let bucket = self.bucket.clone();
        Box::pin(async move {
            token(bucket).await;
            response.await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_gives_burst_tokens_then_qps_per_second() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(2.0, 3, t0);
        for _ in 0..3 {
            assert_eq!(b.take(t0), Ok(()));
        }
        let wait = b.take(t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(b.take(t0 + Duration::from_millis(499)).is_err());
        assert_eq!(b.take(t0 + Duration::from_millis(500)), Ok(()));
        // Idle time refills at most `burst` tokens.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.take(later), Ok(()));
        }
        assert!(b.take(later).is_err());
    }

    #[test]
    fn zero_means_the_default_and_a_negative_qps_no_limit() {
        let l = limit_of(0.0, 0).unwrap();
        assert_eq!((l.qps(), l.burst()), (5.0, 10));
        let l = limit_of(7.5, 2).unwrap();
        assert_eq!((l.qps(), l.burst()), (7.5, 2));
        assert!(limit_of(-1.0, 10).is_none());
    }

    /// Counts calls and the requests answered; always ready.
    #[derive(Clone, Default)]
    struct Counter(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl Service<http::Request<()>> for Counter {
        type Response = ();
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<(), Self::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::ready(Ok(()))
        }
    }

    impl Counter {
        fn calls(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    /// Two seconds of (paused, virtual) time have passed since `start`.
    fn assert_two_seconds(start: Instant, what: &str) {
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_millis(2050),
            "{what}: {took:?}"
        );
    }

    /// Drives `poll_ready` then `call`, as kube's buffer does, then the response.
    async fn request(svc: &mut RateLimited<Counter>, uri: &str) {
        std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
        let req = http::Request::builder().uri(uri).body(()).unwrap();
        svc.call(req).await.unwrap();
    }

    fn paused_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    }

    #[test]
    fn requests_beyond_the_burst_wait_for_their_token() {
        paused_runtime().block_on(async {
            let counter = Counter::default();
            let mut svc = limit_of(4.0, 2).unwrap().layer(counter.clone());
            let start = Instant::now();
            for _ in 0..10 {
                request(&mut svc, "/api/v1/services?limit=500").await;
            }
            // 2 at once, then 8 at 4/s: 2 s of (paused, virtual) time.
            assert_eq!(counter.calls(), 10);
            assert_two_seconds(start, "8 requests beyond the burst at 4/s");
        });
    }

    /// A list of 200 pages costs one token: its first page's. A watch and a new
    /// list after it still wait for theirs.
    #[test]
    fn the_pages_of_one_list_take_one_token() {
        paused_runtime().block_on(async {
            let counter = Counter::default();
            let mut svc = limit_of(1.0, 1).unwrap().layer(counter.clone());
            let start = Instant::now();
            request(&mut svc, "/api/v1/services?limit=500").await;
            for page in 1..200 {
                request(
                    &mut svc,
                    &format!("/api/v1/services?limit=500&continue=eyJydiI6{page}"),
                )
                .await;
            }
            assert_eq!(start.elapsed(), Duration::ZERO, "the pages did not wait");
            request(&mut svc, "/api/v1/services?watch=true&resourceVersion=7").await;
            request(&mut svc, "/api/v1/services?limit=500&continue=").await;
            assert_eq!(counter.calls(), 202);
            assert_two_seconds(start, "the watch and the next list, a second each");
        });
    }

    #[test]
    fn a_continued_page_is_told_by_its_query() {
        let continues = |u: &str| continues_a_list(&u.parse().unwrap());
        assert!(continues("/api/v1/services?limit=500&continue=abc"));
        assert!(continues("/api/v1/services?continue=abc&limit=500"));
        assert!(!continues("/api/v1/services?limit=500&continue="));
        assert!(!continues("/api/v1/services?limit=500"));
        assert!(!continues("/api/v1/services?labelSelector=continue%3Dx"));
        assert!(!continues("/api/v1/services"));
    }
}
