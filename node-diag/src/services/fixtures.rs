//! What `iptables-nft-save`, `iptables-legacy-save` and `nft -j` (nft 1.0.6, iptables
//! 1.8.9) printed for the kube-proxy-shaped rules in `fixtures/` (see
//! `fixtures/regen.sh`).

pub(crate) const IPTABLES_NFT_SAVE_V4: &str = include_str!("fixtures/iptables-nft-save-v4.txt");
pub(crate) const IPTABLES_LEGACY_SAVE_V4: &str =
    include_str!("fixtures/iptables-legacy-save-v4.txt");
pub(crate) const IP6TABLES_NFT_SAVE: &str = include_str!("fixtures/ip6tables-nft-save.txt");
pub(crate) const IP6TABLES_LEGACY_SAVE: &str = include_str!("fixtures/ip6tables-legacy-save.txt");
pub(crate) const NFT_IP_JSON: &str = include_str!("fixtures/nft-ip.json");
pub(crate) const NFT_IP6_JSON: &str = include_str!("fixtures/nft-ip6.json");
