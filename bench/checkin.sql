-- The door's admission (POST /api/organizers/{slug}/events/{id}/checkin/)
-- as PostgreSQL sees it, for pgbench: figure 16's baseline.
--
-- Only the ONE statement a scan that admits sends to the database
-- (door/services.py, _ADMIT_FAST_SQL; docs/door.md): the check-in row
-- inserted from the ticket's seat link while the link is live at the code's
-- version, its purchase CONFIRMED, no revocation names it and the code's key
-- is the event's and not retired, at most once per ticket (ON CONFLICT DO
-- NOTHING on the check-in's unique key); the scan's `ok` row written from
-- what it inserted; the seat's ref read back; in autocommit. A scan through
-- the API sends one statement more on its connection: the caller's
-- membership with its organizer (the figure records them in its JSON,
-- figures.16_door.script.statements, captured around a real scan in the
-- bench's process). Each run compares this statement's shape with the one
-- the API sends (bench/figures/door.py: check_script) and fails the figure
-- when they differ.
--
-- Django with psycopg 3 binds parameters on the client and sends it with the
-- simple query protocol (-M simple); with DB_SERVER_SIDE_BINDING it is the
-- extended protocol (-M prepared), which makes every variable a parameter:
-- no variable stands inside a quoted literal (the figure passes :pk quoted
-- for -M simple, bare for -M prepared). The service's gate, code and time
-- are constants and now() here.
--
-- Variables (bench/figures/door.py passes them with -D):
--   ev        the event whose tickets this run scans (confirmed purchases of
--             one seat each, written by SQL: bench/figures/cancellation.py,
--             confirmed_event)
--   idoff     seat id = idoff + n (the event's seats have contiguous ids)
--   toff      ticket (seat link) id = toff + n (the links were inserted in
--             the seats' order; the figure checks the ids are contiguous)
--   nclients  -c, so that client k scans tickets k+1, k+1+N, k+1+2N, ...
--   uid       the door staff's user (the check-in's by_id)
--   version   the tickets' version (0: none was reissued)
--   kv, pk    the event's current key: its version and its public bytes
--   i         0; pgbench keeps a client's variables between transactions,
--             so :i counts this client's transactions

\set i :i + 1
\set n (:i - 1) * :nclients + :client_id + 1
\set seat :idoff + :n
\set ticket :toff + :n

WITH admitted AS (INSERT INTO door_checkin (event_id, ticket_id, version, gate, checked_in_at, by_id) SELECT rs.event_id, rs.id, rs.ticket_version, 'pgbench', now(), :uid FROM purchases_reservationseat rs JOIN purchases_purchasesaga sg ON sg.reservation_id = rs.reservation_id AND sg.event_id = rs.event_id WHERE rs.event_id = :ev AND rs.id = :ticket AND rs.seat_id = :seat AND rs.released_at IS NULL AND rs.ticket_version = :version AND sg.state = 'CONFIRMED' AND NOT EXISTS (SELECT 1 FROM door_ticketrevocation r WHERE r.event_id = rs.event_id AND r.ticket_id = rs.id AND r.version = rs.ticket_version) AND EXISTS (SELECT 1 FROM door_eventkey k WHERE k.event_id = rs.event_id AND k.version = :kv AND k.public_key = :pk AND k.retired_at IS NULL) FOR SHARE OF rs ON CONFLICT (event_id, ticket_id) DO NOTHING RETURNING ticket_id, checked_in_at), scanned AS (INSERT INTO door_scan (event_id, ticket_id, gate, at, result, by_id, offline, conflict, code, recorded_at) SELECT :ev, ticket_id, 'pgbench', now(), 'ok', :uid, false, false, 'pgbench', now() FROM admitted) SELECT a.checked_in_at, s.ref FROM admitted a LEFT JOIN purchases_seat s ON s.id = :seat AND s.event_id = :ev;
