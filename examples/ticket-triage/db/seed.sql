-- The support tickets of the ticket-triage example. `trellis run` creates
-- db/db.sqlite from this file when the database is missing.
CREATE TABLE tickets (
  id INTEGER PRIMARY KEY,
  subject TEXT NOT NULL,
  body TEXT NOT NULL,
  status TEXT NOT NULL
);
INSERT INTO tickets (id, subject, body, status) VALUES
  (1, 'Checkout down for all customers', 'Since 09:00 every payment fails with error 502. We are losing orders.', 'open'),
  (2, 'Refund for duplicate charge', 'I was charged twice for order 4411. Please refund one of the charges.', 'open'),
  (3, 'Typo on pricing page', 'The word "anual" on the pricing page should be "annual".', 'open'),
  (4, 'Password reset email', 'The reset email arrived after I asked again. Solved now.', 'closed');
