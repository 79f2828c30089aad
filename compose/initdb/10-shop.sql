-- The source database the compose stack's Debezium connector captures: a shop's orders table with a few rows.
-- (The target database, cdcsync, is the image's own POSTGRES_DB.)
CREATE DATABASE shop;
\connect shop
CREATE TABLE public.orders (
    id bigint PRIMARY KEY,
    customer_id bigint NOT NULL,
    amount numeric(12,2),
    status text NOT NULL,
    "Note" text,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO public.orders (id, customer_id, amount, status, "Note")
SELECT g, 1 + g % 50, round((g * 7.31)::numeric % 500, 2), (ARRAY['new', 'paid', 'shipped'])[1 + g % 3], NULL
FROM generate_series(1, 1000) AS g;
