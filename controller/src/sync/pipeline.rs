//! The request pipeline: requests in flight on one connection, bounded in
//! number and in content bytes ([`MAX_IN_FLIGHT`], [`MAX_IN_FLIGHT_BYTES`])
//! so other calls on the connection stay fast, their answers collected as
//! they land or in the order asked; and the final answer of a single call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::stream::{FuturesOrdered, FuturesUnordered, StreamExt};
use outpost_protocol::{Request, Response};

use super::limits::{MAX_IN_FLIGHT, MAX_IN_FLIGHT_BYTES};
use crate::session::{Call, CallError, ScopedConn};

pub(super) type Flight<T> = Pin<Box<dyn Future<Output = Landed<T>> + Send>>;

/// A request that got its final answer.
pub(super) struct Landed<T> {
    pub(super) tag: T,
    weight: u64,
    /// Every response, the final one last.
    pub(super) result: Result<Vec<Response>, CallError>,
}

/// Requests in flight on one connection, bounded in number and in content
/// bytes. Answers wait in the connection's queue until collected, so nothing
/// is lost while the sync is busy elsewhere.
pub(super) struct Pipeline<T> {
    pub(super) conn: ScopedConn,
    flights: Flights<T>,
    bytes: u64,
}

enum Flights<T> {
    AsLanded(FuturesUnordered<Flight<T>>),
    InOrder(FuturesOrdered<Flight<T>>),
}

impl<T: Send + 'static> Pipeline<T> {
    /// Answers collected as they land.
    pub(super) fn new(conn: ScopedConn) -> Pipeline<T> {
        Pipeline {
            conn,
            flights: Flights::AsLanded(FuturesUnordered::new()),
            bytes: 0,
        }
    }

    /// Answers collected in the order the requests were sent: the host
    /// serves them at once, so one may land before an earlier one.
    pub(super) fn in_order(conn: ScopedConn) -> Pipeline<T> {
        Pipeline {
            conn,
            flights: Flights::InOrder(FuturesOrdered::new()),
            bytes: 0,
        }
    }

    fn in_flight(&self) -> usize {
        match &self.flights {
            Flights::AsLanded(f) => f.len(),
            Flights::InOrder(f) => f.len(),
        }
    }

    /// Drops every request in flight, which cancels it.
    pub(super) fn cancel_all(&mut self) {
        match &mut self.flights {
            Flights::AsLanded(f) => f.clear(),
            Flights::InOrder(f) => f.clear(),
        }
        self.bytes = 0;
    }

    /// Whether a request of `weight` bytes must wait for room.
    pub(super) fn is_full(&self, weight: u64) -> bool {
        let in_flight = self.in_flight();
        in_flight > 0 && (in_flight >= MAX_IN_FLIGHT || self.bytes + weight > MAX_IN_FLIGHT_BYTES)
    }

    /// Sends `request`, with `content` as the content it carries when that
    /// is given (see [`ScopedConn::start_with_content`]).
    pub(super) fn start(
        &mut self,
        request: Request,
        content: Option<Arc<Vec<u8>>>,
        tag: T,
        weight: u64,
    ) -> Result<(), CallError> {
        let mut call = match content {
            Some(content) => self.conn.start_with_content(request, content)?,
            None => self.conn.start(request)?,
        };
        self.bytes += weight;
        let flight: Flight<T> = Box::pin(async move {
            let mut responses = Vec::new();
            let result = loop {
                match call.next().await {
                    Ok(response) => {
                        let last = response.is_final();
                        responses.push(response);
                        if last {
                            break Ok(responses);
                        }
                    }
                    Err(e) => break Err(e),
                }
            };
            Landed {
                tag,
                weight,
                result,
            }
        });
        match &mut self.flights {
            Flights::AsLanded(f) => f.push(flight),
            Flights::InOrder(f) => f.push_back(flight),
        }
        Ok(())
    }

    pub(super) async fn next(&mut self) -> Option<Landed<T>> {
        let landed = match &mut self.flights {
            Flights::AsLanded(f) => f.next().await,
            Flights::InOrder(f) => f.next().await,
        }?;
        self.bytes -= landed.weight;
        Some(landed)
    }
}

/// The final response of a landed request.
pub(super) fn final_of(result: Result<Vec<Response>, CallError>) -> Result<Response, CallError> {
    result?
        .pop()
        .ok_or_else(|| CallError::Protocol("a request ended without an answer".into()))
}

pub(super) async fn final_answer(mut call: Call) -> Result<Response, CallError> {
    loop {
        let response = call.next().await?;
        if response.is_final() {
            return Ok(response);
        }
    }
}
