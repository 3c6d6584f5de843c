-- The reserve (POST /api/purchases/) as PostgreSQL sees it, for pgbench.
--
-- Statement for statement what one successful request sends on its
-- connection (captured with CaptureQueriesContext around a real request,
-- see bench/figures/reserve.py: check_script; the run compares the shapes
-- and warns when the product's transaction changes):
--
--   1-10 BEGIN .. COMMIT               purchase_start's durable atomic block:
--                                      the event's rules with the seats by ref
--                                      (no lock), the idempotency record (ON
--                                      CONFLICT DO NOTHING), the seats locked
--                                      and held in one UPDATE (returning the
--                                      prices held at), four inserts, the hold
--                                      timer
--
-- The bench's event has no limit per buyer: an event with one adds two
-- statements after the read (the buyer's advisory lock, the count of the
-- buyer's seats), which this script does not send.
--
-- Under load nothing else reaches the database: the connection health check
-- runs only on a connection idle for DB_IDLE_CHECK_AFTER_SECONDS
-- (config/middleware.py), and the token's user is remembered in the cache
-- (purchases/authentication.py). Until issue 15 both were here, as a
-- SELECT 1 and the token + user look-up, each in autocommit.
--
-- (Before the reserve was profiled it was 17 round trips and 4 commits: an
-- event check, an idempotency look-up and the seat read each in autocommit,
-- a savepoint around the idempotency insert, SELECT ... FOR UPDATE then
-- UPDATE. The git history of this file keeps that script.)
--
-- Django with psycopg 3 and no OPTIONS["server_side_binding"] binds parameters
-- on the client and sends every statement with the simple query protocol
-- (psycopg ClientCursor -> PQsendQuery): run it with -M simple. With
-- DB_SERVER_SIDE_BINDING=true the server binds them (the extended protocol)
-- and psycopg prepares a statement once it ran DB_PREPARE_THRESHOLD times on
-- a connection: run it with -M prepared (bench/prepare.py: pgbench_mode).
-- No variable stands inside a quoted literal, because those modes make each
-- one a parameter ($n), which a literal cannot hold: text is built with ||,
-- the interval with make_interval.
--
-- Variables (bench/figures/reserve.py passes them with -D):
--   ev        the event whose seats this run takes
--   idoff     seat id = idoff + n (the event's seats were inserted in one go,
--             'S1'..'S<N>', so their ids are contiguous)
--   nbase     first seat number minus one
--   nclients  -c, so that client k takes seats k+1, k+1+N, k+1+2N, ...
--   ubase     user id of client 0 (client k is user ubase + k, token
--             md5('bench-token-' || id))
--   run       a number that keeps keys and refs unique across runs
--   hold      PURCHASE_HOLD_SECONDS of the stack
--   i         0; pgbench keeps a client's variables between transactions,
--             so :i counts this client's transactions
--
-- Literal values the application computes in Python (timestamps, uuids,
-- the reservation ref, the response body) are made by the server here
-- (now(), md5(...)::uuid) or are constants of the same size.

\set i :i + 1
\set n :nbase + (:i - 1) * :nclients + :client_id + 1
\set seat :idoff + :n
\set uid :ubase + :client_id

BEGIN;

SELECT e.status, e.sales_start, e.sales_end, e.hold_seconds, e.max_seats_per_buyer, w.event_id IS NOT NULL, w.active IS TRUE, s.id, s.ref, s.price_amount, s.currency FROM purchases_event e LEFT JOIN purchases_seat s ON s.event_id = e.id AND s.ref = ANY(ARRAY['S' || :n]) LEFT JOIN purchases_waitingroom w ON w.event_id = e.id AND e.waiting_room WHERE e.id = :ev ORDER BY s.id;

INSERT INTO purchases_idempotencyrecord (user_id, key, request_hash, response_body, saga_id, created_at) VALUES (:uid, 'pgb-' || :run || '-' || :i, md5('pgb-' || :run || '-' || :client_id || '-' || :i) || md5('h-' || :run || '-' || :client_id || '-' || :i), '{"id": "4b7cd96b-711a-4c98-8454-46dc1b1867a5", "status": "PENDING", "event": 1, "seats": ["S1"], "total": {"amount": 5000, "currency": "EUR"}, "hold_expires_at": "2026-12-02T19.12.33.732366Z"}'::jsonb, md5('pgb-' || :run || '-' || :client_id || '-' || :i)::uuid, now()) ON CONFLICT (user_id, key) DO NOTHING RETURNING id;

UPDATE purchases_seat SET status = 'held' FROM (SELECT id FROM purchases_seat WHERE event_id = :ev AND id = ANY(ARRAY[:seat]::bigint[]) AND status = 'available' ORDER BY id FOR UPDATE SKIP LOCKED) AS locked WHERE purchases_seat.id = locked.id AND purchases_seat.event_id = :ev AND purchases_seat.status = 'available' RETURNING purchases_seat.id, purchases_seat.price_amount;

INSERT INTO "purchases_reservation" ("ref", "event_id", "buyer_id", "status", "hold_expires_at", "total_amount", "currency", "created_at") VALUES ('P' || :run || '-' || :client_id || '-' || :i, :ev, :uid, 'HELD', now() + make_interval(secs => :hold), 5000, 'EUR', now()) RETURNING "purchases_reservation"."id" AS res_id \gset

INSERT INTO "purchases_reservationseat" ("reservation_id", "seat_id", "event_id", "released_at") VALUES (:res_id, :seat, :ev, NULL) RETURNING "purchases_reservationseat"."id";

INSERT INTO "purchases_purchasesaga" ("id", "reservation_id", "event_id", "buyer_id", "intent_id", "payment_method", "amount", "currency", "state", "version", "attempts", "created_at", "updated_at", "compensation_started_at", "awaiting_operator_since", "trace_context") VALUES (md5('pgb-' || :run || '-' || :client_id || '-' || :i)::uuid, :res_id, :ev, :uid, 'pi_P' || :run || '-' || :client_id || '-' || :i, 'pm_card_visa', 5000, 'EUR', 'PENDING', 1, 0, now(), now(), NULL, NULL, '');

INSERT INTO "purchases_sagahistory" ("saga_id", "event_id", "from_state", "to_state", "at", "reason", "actor", "actor_name", "version") VALUES (md5('pgb-' || :run || '-' || :client_id || '-' || :i)::uuid, :ev, NULL, 'PENDING', now(), 'purchase started', 'system', '', 1) RETURNING "purchases_sagahistory"."id";

INSERT INTO "outbox_outboxmessage" ("topic", "payload", "key", "event_id", "saga_id", "created_at", "available_at", "claimed_until", "fired_at", "handed_over_at", "cancelled_at", "completed_at", "processing_until", "due_at", "deliveries", "attempts", "last_error", "last_error_at", "dead_at", "replayed_at", "only_consumers", "trace_context") VALUES ('purchase.hold_expired', jsonb_build_object('saga_id', md5('pgb-' || :run || '-' || :client_id || '-' || :i)::uuid::text), 'hold:' || md5('pgb-' || :run || '-' || :client_id || '-' || :i)::uuid::text, :ev, md5('pgb-' || :run || '-' || :client_id || '-' || :i)::uuid, now(), now() + make_interval(secs => :hold), NULL, NULL, NULL, NULL, NULL, NULL, now() + make_interval(secs => :hold), 0, 0, '', NULL, NULL, NULL, NULL, '') RETURNING "outbox_outboxmessage"."id", "outbox_outboxmessage"."attempts", "outbox_outboxmessage"."last_error";

COMMIT;
