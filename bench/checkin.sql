-- The door's admission (POST /api/organizers/{slug}/events/{id}/checkin/)
-- as PostgreSQL sees it, for pgbench: figure 16's baseline.
--
-- Only the ONE conditional statement that admits a ticket
-- (door/services.py, _ADMIT; docs/door.md): the check-in row inserted from
-- the ticket's seat link while the link is live at the code's version, its
-- purchase CONFIRMED and no revocation names it, at most once per ticket
-- (ON CONFLICT DO NOTHING on the check-in's unique key), in autocommit. A
-- scan through the API sends more on its connection: the caller's
-- membership (with its organizer) and the event read, the event's keys read
-- to verify the signature, the ticket's state read after the insert (the
-- seat shown), the scan's row, BEGIN and COMMIT (the figure records them in
-- its JSON, figures.16_door.script.statements, captured around a real scan
-- in the bench's process). Each run compares this statement's shape with
-- the one the API sends (bench/figures/door.py: check_script) and fails the
-- figure when they differ.
--
-- Django with psycopg 3 binds parameters on the client and sends it with the
-- simple query protocol (-M simple); with DB_SERVER_SIDE_BINDING it is the
-- extended protocol (-M prepared), which makes every variable a parameter:
-- no variable stands inside a quoted literal. The service's gate and time
-- are a constant and now() here.
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
--   i         0; pgbench keeps a client's variables between transactions,
--             so :i counts this client's transactions

\set i :i + 1
\set n (:i - 1) * :nclients + :client_id + 1
\set seat :idoff + :n
\set ticket :toff + :n

INSERT INTO door_checkin (event_id, ticket_id, version, gate, checked_in_at, by_id) SELECT rs.event_id, rs.id, rs.ticket_version, 'pgbench', now(), :uid FROM purchases_reservationseat rs JOIN purchases_purchasesaga sg ON sg.reservation_id = rs.reservation_id AND sg.event_id = rs.event_id WHERE rs.event_id = :ev AND rs.id = :ticket AND rs.seat_id = :seat AND rs.released_at IS NULL AND rs.ticket_version = :version AND sg.state = 'CONFIRMED' AND NOT EXISTS (SELECT 1 FROM door_ticketrevocation r WHERE r.event_id = rs.event_id AND r.ticket_id = rs.id AND r.version = rs.ticket_version) FOR SHARE OF rs ON CONFLICT (event_id, ticket_id) DO NOTHING RETURNING checked_in_at;
