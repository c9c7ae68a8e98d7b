// A real OpenID provider for the ingress SSO tests: the certified `oidc-provider`, on
// 127.0.0.1, with one confidential client that must use PKCE and the test users the test
// names. Its login and consent pages are oidc-provider's own development interactions
// (any password is accepted for a known user). Everything comes from the JSON in
// OIDC_TEST_CONFIG: { port, issuer, client: { id, secret, redirect_uri }, users: { id: claims } };
// secrets and keys are made by the test, at test time. Prints "ready" once listening.
import { generateKeyPairSync, randomBytes } from "node:crypto";
import Provider from "oidc-provider";

const config = JSON.parse(process.env.OIDC_TEST_CONFIG);
const signing = generateKeyPairSync("rsa", { modulusLength: 2048 }).privateKey
  .export({ format: "jwk" });

const provider = new Provider(config.issuer, {
  clients: [{
    client_id: config.client.id,
    client_secret: config.client.secret,
    redirect_uris: [config.client.redirect_uri],
    grant_types: ["authorization_code"],
    response_types: ["code"],
    token_endpoint_auth_method: "client_secret_basic",
  }],
  pkce: { required: () => true },
  jwks: { keys: [{ ...signing, kid: "test-" + randomBytes(4).toString("hex"), use: "sig", alg: "RS256" }] },
  cookies: { keys: [randomBytes(32).toString("hex")] },
  claims: {
    openid: ["sub"],
    email: ["email", "email_verified"],
    profile: ["name"],
    groups: ["groups"],
  },
  features: { devInteractions: { enabled: true } },
  async findAccount(ctx, id) {
    const claims = config.users[id];
    if (!claims) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...claims }; } };
  },
});
provider.on("server_error", (ctx, err) => console.error("server_error", err));

provider.listen(config.port, "127.0.0.1", () => console.log("ready"));
